"""Pure rendering: a DisaggregatedModel becomes the list of its desired child objects.

No I/O here (an import-linter contract enforces it): the same input always yields the same
objects in the same order, so ``disagg render`` output is byte-identical across runs.
"""

from __future__ import annotations

from disagg.render.common import Manifest, RenderContext, owner_references
from disagg.render.gateway import render_http_route
from disagg.render.inference_pool import render_epp, render_epp_deployment, render_inference_pool
from disagg.render.router import render_router_deployment, render_router_rbac, router_endpoint
from disagg.render.scaling import render_scaler
from disagg.render.services import render_pdb, render_pool_service, render_router_service
from disagg.render.workers import render_pool

ROLES = ("prefill", "decode")


def render_all(ctx: RenderContext) -> list[Manifest]:
    """Every child the model wants, dependencies first (RBAC, Services, then workloads):
    the pools of its mode (prefill and decode, or the colocated engine pool) and the router."""
    spec = ctx.model.spec
    router_on = spec.router.enabled
    builtin = spec.router.kind == "builtin"
    objects: list[Manifest] = []
    if router_on:
        objects += render_router_rbac(ctx) if builtin else render_epp(ctx)
    objects += [render_pool_service(ctx, role) for role in spec.roles]
    if router_on and builtin:
        objects.append(render_router_service(ctx))
    objects += [render_pdb(ctx, role) for role in spec.roles]
    if router_on:
        objects.append(render_pdb(ctx, "router"))
    objects += [render_pool(ctx, role) for role in spec.roles]
    if router_on:
        objects.append(render_router_deployment(ctx) if builtin else render_epp_deployment(ctx))
    autoscaling = spec.autoscaling
    if autoscaling.enabled and autoscaling.mode == "external":
        objects += [render_scaler(ctx, role) for role in spec.roles]
    if router_on and not builtin:
        objects.append(render_inference_pool(ctx))
    route = render_http_route(ctx)
    if route is not None:
        objects.append(route)
    return objects


__all__ = [
    "ROLES",
    "Manifest",
    "RenderContext",
    "owner_references",
    "render_all",
    "router_endpoint",
]
