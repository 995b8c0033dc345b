"""A pool's ``affinity``, typed and validated as the API server validates a pod's (Kubernetes
v1.35.4, ``pkg/apis/core/validation``: validateNodeAffinity, ValidateNodeSelector,
ValidateNodeSelectorRequirement, ValidateNodeFieldSelectorRequirement,
validatePodAffinityTerm, and apimachinery's ValidateLabelSelectorRequirement).

Label values are checked in preferred terms too, where the API server lets an invalid one
through (it can never match a real label, so such a term does nothing).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field

from disagg.api.base import ApiModel
from disagg.api.rules import Rule
from disagg.api.scheduling import (
    DNS_LABEL,
    LABEL_VALUE,
    QUALIFIED_NAME,
    label_keys_rule,
    prefix_fits,
)

LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=QUALIFIED_NAME)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
Weight = Annotated[int, Field(ge=1, le=100, description="1 to 100.")]
_COUNT: Final = "(has(self.values) ? size(self.values) : 0)"
_KEY_PREFIX_CEL: Final = "!self.key.contains('/') || self.key.indexOf('/') <= 253"


def _key_rule(what: str) -> Rule:
    return Rule(
        cel=_KEY_PREFIX_CEL,
        message=f"{what}: the prefix of key (before '/') must be at most 253 characters",
        check=lambda m: prefix_fits(m.key),
        field_path=".key",
    )


class NodeSelectorRequirement(ApiModel):
    """A node label and what its value must be."""

    key: LabelKey = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[LabelValue] = Field(
        default_factory=list, max_length=64, description="Values (one for Gt and Lt)."
    )

    rules: ClassVar = (
        _key_rule("node affinity"),
        Rule(
            cel=f"self.operator in ['In', 'NotIn'] ? {_COUNT} > 0 : "
            f"self.operator in ['Exists', 'DoesNotExist'] ? {_COUNT} == 0 : {_COUNT} == 1",
            message="node affinity: In and NotIn need values, Exists and DoesNotExist take "
            "none, Gt and Lt take exactly one",
            check=lambda m: (
                len(m.values) > 0
                if m.operator in ("In", "NotIn")
                else not m.values
                if m.operator in ("Exists", "DoesNotExist")
                else len(m.values) == 1
            ),
            field_path=".values",
        ),
    )


class NodeFieldRequirement(ApiModel):
    """A node field: only ``metadata.name``, with In or NotIn and one value."""

    key: Literal["metadata.name"] = Field(description="metadata.name.")
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn.")
    values: list[Annotated[str, Field(max_length=253)]] = Field(
        min_length=1, max_length=1, description="One node name."
    )


class NodeSelectorTerm(ApiModel):
    """Requirements a node must all meet."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="By node label."
    )
    match_fields: list[NodeFieldRequirement] = Field(
        default_factory=list, max_length=8, description="By node field."
    )


class NodeSelector(ApiModel):
    """Terms of which a node must meet at least one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=32, description="At least one term."
    )


class PreferredSchedulingTerm(ApiModel):
    """A node preference and its weight."""

    weight: Weight
    preference: NodeSelectorTerm = Field(description="What the preferred nodes have.")


class NodeAffinity(ApiModel):
    """Which nodes the pool's pods may, or prefer to, run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=32, description="Nodes the pods prefer."
    )


class LabelSelectorRequirement(ApiModel):
    """A pod label and what its value must be."""

    key: LabelKey = Field(description="Pod label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[LabelValue] = Field(default_factory=list, max_length=64, description="Values.")

    rules: ClassVar = (
        _key_rule("pod affinity"),
        Rule(
            cel=f"self.operator in ['In', 'NotIn'] ? {_COUNT} > 0 : {_COUNT} == 0",
            message="pod affinity: In and NotIn need values, Exists and DoesNotExist take none",
            check=lambda m: (len(m.values) > 0) == (m.operator in ("In", "NotIn")),
            field_path=".values",
        ),
    )


class LabelSelector(ApiModel):
    """Pods (or namespaces) by label."""

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Exact labels."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Label requirements."
    )

    rules: ClassVar = (
        label_keys_rule(
            "matchLabels", "match_labels", "pod affinity: each matchLabels key must be a label key"
        ),
    )


class PodAffinityTerm(ApiModel):
    """Pods to run near (or away from), within a topology domain."""

    label_selector: LabelSelector | None = Field(default=None, description="Which pods.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces of those pods, by label."
    )
    namespaces: list[Annotated[str, Field(max_length=63, pattern=DNS_LABEL)]] = Field(
        default_factory=list, max_length=32, description="Namespaces of those pods."
    )
    topology_key: LabelKey = Field(description="Node label that defines the domain.")
    match_label_keys: list[LabelKey] = Field(
        default_factory=list, max_length=32, description="Keys of this pod's labels to match."
    )
    mismatch_label_keys: list[LabelKey] = Field(
        default_factory=list, max_length=32, description="Keys of this pod's labels to differ."
    )

    rules: ClassVar = (
        Rule(
            cel="!self.topologyKey.contains('/') || self.topologyKey.indexOf('/') <= 253",
            message="pod affinity: the prefix of topologyKey (before '/') must be at most 253 "
            "characters",
            check=lambda m: prefix_fits(m.topology_key),
            field_path=".topologyKey",
        ),
    )


class WeightedPodAffinityTerm(ApiModel):
    """A pod-affinity preference and its weight."""

    weight: Weight
    pod_affinity_term: PodAffinityTerm = Field(description="The preference.")


class PodAffinity(ApiModel):
    """Pods to run near (affinity) or away from (anti-affinity)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=16, description="Terms the pods must meet."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=16, description="Terms the pods prefer."
    )


class Affinity(ApiModel):
    """A Kubernetes Affinity for the pool's pods."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")
