"""What every rendered child shares: the owner reference, metadata, the render context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from disagg.api.autoscaling import DEFAULT_PROMETHEUS_URL
from disagg.api.resource import API_VERSION, KIND, DisaggregatedModel
from disagg.api.spec import Mode
from disagg.naming import ComponentRole, labels
from disagg.versions import DEFAULT_IMAGES, DataPlaneImages

Manifest = dict[str, Any]


@dataclass(frozen=True)
class RenderContext:
    """The model plus what the operator knows that the spec does not say.

    ``replicas`` is the builtin autoscaler's decision for a pool (or, between evaluations,
    the pool's live size); without it the Deployment gets ``spec.<pool>.replicas``, within
    the autoscaling bounds when autoscaling is on (see ``pool_replicas``).
    """

    model: DisaggregatedModel
    replicas: dict[str, int] = field(default_factory=dict)
    router_mode: Mode | None = None
    """The mode the router serves, when a mode switch still routes to the old pools
    (:mod:`disagg.transition`); None: the spec's."""
    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    """The operator's Prometheus, for a model that names none (KEDA's triggers read it)."""
    images: DataPlaneImages = DEFAULT_IMAGES
    """The operator's engine and router images, for a model that names none."""

    @property
    def name(self) -> str:
        return self.model.metadata.name

    @property
    def namespace(self) -> str:
        return self.model.metadata.namespace


def image_pull_secrets(model: DisaggregatedModel) -> Manifest:
    """The pod spec's ``imagePullSecrets`` for every pod of the model, or nothing."""
    names = [{"name": ref.name} for ref in model.spec.image_pull_secrets]
    return {"imagePullSecrets": names} if names else {}


def owner_references(model: DisaggregatedModel) -> list[Manifest]:
    """The controller reference to the model, or none when it has no uid (offline render)."""
    uid = model.metadata.uid
    if not uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": model.metadata.name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def object_meta(ctx: RenderContext, name: str, role: ComponentRole) -> Manifest:
    """metadata of a child object: name, namespace, labels, owner."""
    meta: Manifest = {"name": name, "namespace": ctx.namespace, "labels": labels(ctx.name, role)}
    owners = owner_references(ctx.model)
    if owners:
        meta["ownerReferences"] = owners
    return meta
