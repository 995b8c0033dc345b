"""The model behind the user's Gateway: a Gateway API v1 HTTPRoute to the router Service."""

from __future__ import annotations

from typing import Final

from disagg.api.gateway import GatewayParentReference
from disagg.naming import child_name
from disagg.render.common import Manifest, RenderContext, object_meta
from disagg.render.inference_pool import EXTENSION_GROUP

GATEWAY_API: Final = "gateway.networking.k8s.io/v1"


def render_http_route(ctx: RenderContext) -> Manifest | None:
    """The HTTPRoute of ``spec.gateway`` (None when unset): every request under its path,
    on its hostnames, to the router Service's port (or, with router.kind inferencePool, to
    the model's InferencePool), path unchanged."""
    spec = ctx.model.spec
    gateway = spec.gateway
    if gateway is None or not spec.router.enabled:
        return None
    backend: Manifest = (
        {"name": child_name(ctx.name, "router"), "port": spec.router.port}
        if spec.router.kind == "builtin"
        else {"group": EXTENSION_GROUP, "kind": "InferencePool", "name": ctx.name}
    )
    route: Manifest = {
        "parentRefs": [_parent(ref) for ref in gateway.parent_refs],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": gateway.path}}],
                "backendRefs": [backend],
            }
        ],
    }
    if gateway.hostnames:
        route["hostnames"] = list(gateway.hostnames)
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": object_meta(ctx, child_name(ctx.name, "router"), "router"),
        "spec": route,
    }


def _parent(ref: GatewayParentReference) -> Manifest:
    """A parentRef with the group and kind spelled out, as the API server defaults them:
    what is applied then equals what is read back, and drift stays quiet."""
    parent: Manifest = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": ref.name}
    if ref.namespace is not None:
        parent["namespace"] = ref.namespace
    if ref.section_name is not None:
        parent["sectionName"] = ref.section_name
    if ref.port is not None:
        parent["port"] = ref.port
    return parent
