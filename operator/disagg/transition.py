"""Pure: a switch of ``spec.mode`` as a rollout with no gap in serving.

Changing the mode replaces the pools (prefill and decode, or the colocated engine pool). The
pass creates the new mode's pools at once and, while they start, keeps the old ones and the
router as they are: the router goes on sending traffic to the old pools. Once every new
pool runs all its desired replicas ready, the router is rendered for the new mode; its
rolling update (one surge pod at a time, never below the ready count) moves traffic over.
Only when every router pod runs the new configuration and none is still draining are the
old pools deleted, and their pods drain what they hold in their preStop hook. The pass reads
all of this from what it lists each time, so a restart of the operator mid-switch resumes it.

With the builtin autoscaler the new pools start with the GPUs the old ones run (shared
evenly between prefill and decode when splitting), within their bounds, so the traffic the
router moves finds about the capacity it left; the autoscaler sizes them from there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from disagg.api.spec import DisaggregatedModelSpec, Mode, Role
from disagg.rollout import rollout_pending

Obj = dict[str, Any]
POOL_ROLES: Final[tuple[Role, ...]] = ("prefill", "decode", "engine")
COLOCATED_FLAG: Final = "--colocated"
"""The router argument that says which mode a live router Deployment serves."""


@dataclass(frozen=True)
class Switch:
    """Where a model stands in a mode switch (``retiring`` empty: no switch under way)."""

    router_mode: Mode
    """The mode the router is rendered for: the old one until the new pools are ready."""
    retiring: tuple[Role, ...] = ()
    """The old mode's pools, kept (neither pruned nor resized) until traffic has moved."""
    message: str | None = None
    """What the switch waits for, for the Progressing condition."""


def mode_roles(mode: Mode) -> tuple[Role, ...]:
    """The pools a mode runs."""
    return ("engine",) if mode == "colocated" else ("prefill", "decode")


def _fully_ready(deployment: Obj | None) -> bool:
    if deployment is None:
        return False
    desired = int(deployment.get("spec", {}).get("replicas", 1))
    return int(deployment.get("status", {}).get("readyReplicas", 0)) >= max(1, desired)


def router_mode(deployment: Obj) -> Mode:
    """The mode a live router Deployment was rendered for."""
    containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    args = (containers or [{}])[0].get("args", [])
    return "colocated" if COLOCATED_FLAG in args else "disaggregated"


def plan_switch(
    mode: Mode,
    deployments: Mapping[str, Obj | None],
    router_enabled: bool,
    router_pods_terminating: int = 0,
) -> Switch:
    """Which mode the router serves and which old pools stay, from the live Deployments by
    role (``router`` included) and how many router pods are still draining."""
    wanted = mode_roles(mode)
    retiring = tuple(r for r in POOL_ROLES if r not in wanted and deployments.get(r) is not None)
    if not retiring:
        return Switch(mode)
    old_mode: Mode = "colocated" if "engine" in retiring else "disaggregated"
    old = ", ".join(retiring)
    starting = [r for r in wanted if not _fully_ready(deployments.get(r))]
    if starting:
        return Switch(
            old_mode,
            retiring,
            f"switching to {mode}: waiting for {', '.join(starting)} to be ready; "
            f"{old} keep serving",
        )
    router = deployments.get("router")
    if router_enabled and router is not None:
        moved = router_mode(router) == mode and rollout_pending(router) is None
        if not moved or router_pods_terminating:
            return Switch(
                mode,
                retiring,
                f"switching to {mode}: the router moves traffic to {', '.join(wanted)}; "
                f"{old} are removed once it has",
            )
    return Switch(mode)


def starting_sizes(
    spec: DisaggregatedModelSpec, retiring: tuple[Role, ...], running: Mapping[str, int]
) -> dict[str, int]:
    """Replicas for the new mode's pools that do not run yet: the GPUs of the ``retiring``
    pools' ``running`` replicas, in each new pool's replica size (the pools' bounds and the
    autoscaler's mode are applied by the renderer)."""
    gpus = sum(running.get(role, 0) * spec.pool(role).gpus for role in retiring)
    new = [role for role in spec.roles if role not in running]
    if not gpus or not new:
        return {}
    share = gpus / len(spec.roles)
    return {role: max(1, math.ceil(share / spec.pool(role).gpus)) for role in new}
