"""Services and PodDisruptionBudgets of the pools and the router."""

from __future__ import annotations

from disagg.api.spec import Role
from disagg.naming import ComponentRole, child_name, selector_labels
from disagg.render.common import Manifest, RenderContext, object_meta
from disagg.render.engine_args import engine_launch


def render_pool_service(ctx: RenderContext, role: Role) -> Manifest:
    """Headless Service of a pool: stable DNS for each engine pod, no load balancing."""
    launch = engine_launch(ctx.model.spec, role)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(ctx, child_name(ctx.name, role), role),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(ctx.name, role),
            "ports": [
                {"name": p.name, "port": p.port, "targetPort": p.name, "protocol": "TCP"}
                for p in launch.ports
            ],
        },
    }


def render_router_service(ctx: RenderContext) -> Manifest:
    """ClusterIP Service in front of the router: the model's API endpoint."""
    port = ctx.model.spec.router.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(ctx, child_name(ctx.name, "router"), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(ctx.name, "router"),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_pdb(ctx: RenderContext, role: ComponentRole) -> Manifest:
    """PodDisruptionBudget of a pool or the router: voluntary evictions (a node drain, a
    cluster upgrade) take one pod at a time, so with two or more replicas one keeps serving."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(ctx, child_name(ctx.name, role), role),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(ctx.name, role)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
