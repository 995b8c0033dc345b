"""What the engine containers get from the spec: environment variables and resources,
validated as the API server validates a container (Kubernetes v1.35.4,
``pkg/apis/core/validation``: validateEnvVarValueFrom, validateObjectFieldSelector,
ValidateContainerResourceRequirements, validateContainerResourceName,
validateResourceQuantityHugePageValue), so a model this accepts renders pods the API
server accepts. One rule is stricter than the API server's: a hugepage amount must be a
whole number of bytes (the API server rounds a fraction up before it checks the page size).
"""

from __future__ import annotations

import re
from typing import ClassVar, Final, Literal

from pydantic import Field

from disagg.api.base import ApiModel, Quantity, exact_quantity, parse_quantity
from disagg.api.rules import Rule
from disagg.api.scheduling import DNS_SUBDOMAIN, QUALIFIED_NAME, label_key_ok, prefix_fits

_ENV_NAME: Final = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_CONFIG_KEY: Final = r"^[-._a-zA-Z0-9]+$"
FIELD_PATHS: Final = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
    "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP",
    "status.podIPs",
)  # fmt: skip
_FIELD_PATH: Final = (
    r"^(" + "|".join(p.replace(".", r"\.") for p in FIELD_PATHS) + r"|"
    r"metadata\.(labels|annotations)\['[^']+'\])$"
)
_RESOURCE_FIELD: Final = (
    r"^(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-[-._a-zA-Z0-9]+)$"
)
CONTAINER_PATTERN_MEANINGS: Final = {
    _ENV_NAME: "must be an environment variable name: letters, digits, '-', '_' or '.', "
    "not starting with a digit",
    _CONFIG_KEY: "must be a Secret or ConfigMap key: letters, digits, '-', '_' or '.'",
    _FIELD_PATH: "must be one of "
    + ", ".join(FIELD_PATHS)
    + ", metadata.labels['<key>'] or metadata.annotations['<key>']",
    _RESOURCE_FIELD: "must be limits.<resource> or requests.<resource> for cpu, memory, "
    "ephemeral-storage or hugepages-<size>",
}
GPU_RESOURCE: Final = "nvidia.com/gpu"
STANDARD_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")


class KeyRef(ApiModel):
    """A key of a Secret or a ConfigMap in the model's namespace."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="Object name.")
    key: str = Field(max_length=253, pattern=_CONFIG_KEY, description="Key in the object.")
    optional: bool | None = Field(default=None, description="Start even if it is missing.")


class FieldRef(ApiModel):
    """A field of the pod (the downward API)."""

    field_path: str = Field(
        max_length=512,
        pattern=_FIELD_PATH,
        description="metadata.name, metadata.namespace, metadata.uid, "
        "metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, "
        "spec.serviceAccountName, status.hostIP(s) or status.podIP(s).",
    )
    api_version: Literal["v1"] | None = Field(default=None, description="Only v1.")


class ResourceFieldRef(ApiModel):
    """A resource request or limit of the engine container."""

    resource: str = Field(
        max_length=128,
        pattern=_RESOURCE_FIELD,
        description="limits.cpu, requests.memory, limits.ephemeral-storage, ...",
    )
    container_name: str | None = Field(default=None, description="Only the engine container.")
    divisor: Quantity | None = Field(default=None, description="Unit of the value (default 1).")


def _sources(m: EnvVarSource) -> int:
    refs = (m.secret_key_ref, m.config_map_key_ref, m.field_ref, m.resource_field_ref)
    return sum(ref is not None for ref in refs)


class EnvVarSource(ApiModel):
    """Where a variable's value comes from: exactly one of the four."""

    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldRef | None = Field(
        default=None, description="A resource of the engine container."
    )

    rules: ClassVar = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
            "has(self.resourceFieldRef)].filter(x, x).size() == 1",
            message="env valueFrom: set exactly one of secretKeyRef, configMapKeyRef, "
            "fieldRef, resourceFieldRef",
            check=lambda m: _sources(m) == 1,
        ),
    )


class EnvVar(ApiModel):
    """An environment variable, as in a Kubernetes container."""

    name: str = Field(max_length=4096, pattern=_ENV_NAME, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="A Secret or ConfigMap key, or a field of the pod."
    )

    rules: ClassVar = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="env: set value or valueFrom, not both",
            check=lambda m: not (m.value is not None and m.value_from is not None),
        ),
    )


def _extended(name: str) -> bool:
    return "/" in name and "kubernetes.io/" not in name


def resource_name_ok(name: str) -> bool:
    """Whether a container may request a resource of this name (the API server's rule)."""
    if not label_key_ok(name):
        return False
    if "/" not in name:
        return name in STANDARD_RESOURCES or name.startswith("hugepages-")
    if not _extended(name):
        return True
    quota = f"requests.{name}"
    return (
        not name.startswith("requests.")
        and bool(re.fullmatch(QUALIFIED_NAME, quota))
        and (prefix_fits(quota))
    )


def _overcommit(name: str) -> bool:
    return not _extended(name) and not name.startswith("hugepages-")


def _value(quantity: str | int) -> float:
    return float(quantity) if isinstance(quantity, int) else parse_quantity(quantity)


def _within_limits(m: ResourceRequirements) -> bool:
    return all(
        _value(q) <= _value(m.limits[k])
        for k, q in m.requests.items()
        if k in m.limits and _overcommit(k)
    )


def _exact(m: ResourceRequirements) -> bool:
    """Extended resources and hugepages: whole numbers (extended), a limit equal to the
    request."""
    for k, q in {**m.limits, **m.requests}.items():
        if _extended(k) and _value(q) != int(_value(q)):
            return False
    return all(
        k in m.limits and _value(q) == _value(m.limits[k])
        for k, q in m.requests.items()
        if not _overcommit(k)
    )


HUGEPAGES: Final = "hugepages-"
_INT64: Final = 2**63


def _hugepages_whole_pages(m: ResourceRequirements) -> bool:
    """Each hugepage amount is a whole number of its (positive, whole-byte) page size."""
    for name, quantity in [*m.requests.items(), *m.limits.items()]:
        if not name.startswith(HUGEPAGES):
            continue
        try:
            page = exact_quantity(name.removeprefix(HUGEPAGES))
        except ValueError:
            return False
        value = exact_quantity(quantity)
        whole = page.denominator == 1 and value.denominator == 1 and value < _INT64
        if not whole or not 0 < page < _INT64 or value % page:
            return False
    return True


def _hugepages_beside_cpu_or_memory(m: ResourceRequirements) -> bool:
    names = {*m.requests, *m.limits}
    return not any(n.startswith(HUGEPAGES) for n in names) or bool(names & {"cpu", "memory"})


def _q(expr: str) -> str:
    return f"quantity(string({expr}))"


def _over_maps(template: str, join: str) -> str:
    """``template`` written once for requests and once for limits (``{map}`` names the map;
    replaced, not formatted: the name patterns hold regex braces), joined by ``join``."""
    return join.join(template.replace("{map}", m) for m in ("requests", "limits"))


def _each_map(template: str) -> str:
    """``template`` holds in requests and in limits, where they are set."""
    return _over_maps("(!has(self.{map}) || " + template + ")", " && ")


_NAME_CEL: Final = (
    "k.matches(r'" + QUALIFIED_NAME + "') && "
    "(!k.contains('/') || k.indexOf('/') <= 253) && "
    "(k.contains('/') ? (k.contains('kubernetes.io/') || (!k.startsWith('requests.') && "
    "('requests.' + k).matches(r'" + QUALIFIED_NAME + "') && k.indexOf('/') <= 244)) : "
    "(k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-')))"
)
_EXTENDED_CEL: Final = "(k.contains('/') && !k.contains('kubernetes.io/'))"
_OVERCOMMIT_CEL: Final = f"(!{_EXTENDED_CEL} && !k.startsWith('hugepages-'))"
_VALID_CEL: Final = "isQuantity(string(self.{map}[k]))"
_PAGE_CEL: Final = "quantity(k.substring(10))"
_WHOLE_PAGES_CEL: Final = (
    "self.{map}.all(k, !k.startsWith('hugepages-') || !" + _VALID_CEL + " || "
    "(isQuantity(k.substring(10)) && "
    + _PAGE_CEL
    + ".isInteger() && "
    + _PAGE_CEL
    + ".asInteger() > 0 && quantity(string(self.{map}[k])).isInteger() && "
    "quantity(string(self.{map}[k])).asInteger() % " + _PAGE_CEL + ".asInteger() == 0))"
)
_HAS_HUGEPAGES_CEL: Final = "(has(self.{map}) && self.{map}.exists(k, k.startsWith('hugepages-')))"
_HAS_CPU_OR_MEMORY_CEL: Final = (
    "(has(self.{map}) && ('cpu' in self.{map} || 'memory' in self.{map}))"
)


class ResourceRequirements(ApiModel):
    """CPU and memory of each replica. GPUs and RDMA devices are added by the operator."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Minimum resources, e.g. {cpu: '8', memory: 64Gi}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=32, description="Maximum resources, e.g. {memory: 128Gi}."
    )

    rules: ClassVar = (
        Rule(
            cel=_each_map("self.{map}.all(k, " + _NAME_CEL + ")"),
            message="resources: each name must be cpu, memory, ephemeral-storage, "
            "hugepages-<size>, or an extended resource with a domain such as example.com/device",
            check=lambda m: all(resource_name_ok(k) for k in {**m.requests, **m.limits}),
        ),
        Rule(
            cel=_over_maps(f"!(has(self.{{map}}) && {GPU_RESOURCE!r} in self.{{map}})", " && "),
            message=f"resources: leave out {GPU_RESOURCE}; the operator requests "
            "tensorParallelSize x dataParallelSize GPUs per replica",
            check=lambda m: GPU_RESOURCE not in m.requests and GPU_RESOURCE not in m.limits,
        ),
        Rule(
            cel="!has(self.requests) || !has(self.limits) || self.requests.all(k, "
            f"!(k in self.limits) || !{_OVERCOMMIT_CEL} || "
            f"!{_VALID_CEL.format(map='requests')} || !{_VALID_CEL.format(map='limits')} || "
            f"{_q('self.requests[k]')}.compareTo({_q('self.limits[k]')}) <= 0)",
            message="resources: each request must be at most its limit",
            check=_within_limits,
        ),
        Rule(
            cel=_each_map(
                "self.{map}.all(k, !"
                + _EXTENDED_CEL
                + " || !"
                + _VALID_CEL
                + " || "
                + _q("self.{map}[k]")
                + ".isInteger())"
            )
            + " && (!has(self.requests) || self.requests.all(k, "
            + _OVERCOMMIT_CEL
            + " || (has(self.limits) && k in self.limits && (!"
            + _VALID_CEL.format(map="requests")
            + " || !"
            + _VALID_CEL.format(map="limits")
            + " || "
            + _q("self.requests[k]")
            + ".compareTo("
            + _q("self.limits[k]")
            + ") == 0))))",
            message="resources: an extended resource (such as example.com/device) must be a "
            "whole number, and it and hugepages need a limit equal to the request",
            check=_exact,
        ),
        Rule(
            cel=_each_map(_WHOLE_PAGES_CEL),
            message="resources: hugepages-<size> must be a whole number of pages of that size "
            "(hugepages-2Mi: 2Mi, 4Mi, 1Gi...)",
            check=_hugepages_whole_pages,
        ),
        Rule(
            cel="!("
            + _over_maps(_HAS_HUGEPAGES_CEL, " || ")
            + ") || "
            + _over_maps(_HAS_CPU_OR_MEMORY_CEL, " || "),
            message="resources: hugepages need cpu or memory set beside them",
            check=_hugepages_beside_cpu_or_memory,
        ),
    )
