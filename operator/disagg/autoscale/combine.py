"""How the pools' decisions combine (pure): a colocated engine pool sized for both phases,
and both pools fitted into the model's GPU budget, the pool further over its SLO first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from disagg.autoscale.policy import Action, Decision, PoolPolicy, ScaledPool


def _action(current: int, desired: int) -> Action:
    return "up" if desired > current else "down" if desired < current else "hold"


def colocated(prefill: Decision, decode: Decision) -> Decision:
    """The colocated engine pool serves both phases on the same replicas: the larger of the
    sizes its TTFT and its TPOT ask for, so it shrinks only when both allow it."""
    current = prefill.current
    desired = max(prefill.desired, decode.desired)
    unreachable = "; ".join(
        f"{d.pool} phase: {d.unreachable}" for d in (prefill, decode) if d.unreachable
    )
    return Decision(
        "engine",
        current,
        desired,
        _action(current, desired),
        f"TTFT: {prefill.reason}; TPOT: {decode.reason}",
        limited=prefill.limited or decode.limited,
        pressure=max(prefill.pressure, decode.pressure),
        unreachable=unreachable or None,
        unreachable_share=max(prefill.unreachable_share, decode.unreachable_share),
        invalid="; ".join(d.invalid for d in (prefill, decode) if d.invalid) or None,
    )


def apply_budget(
    decisions: Sequence[Decision], policies: Mapping[ScaledPool, PoolPolicy], budget: int | None
) -> list[Decision]:
    """Fit both pools into the GPU budget, the pool further over its SLO first."""
    if budget is None:
        return list(decisions)
    gpus = {d.pool: policies[d.pool].gpus_per_replica for d in decisions}
    if sum(d.desired * gpus[d.pool] for d in decisions) <= budget:
        return list(decisions)
    floor = {
        d.pool: max(policies[d.pool].min_replicas, min(d.current, d.desired)) for d in decisions
    }
    left = budget - sum(floor[d.pool] * gpus[d.pool] for d in decisions)
    result = {d.pool: d for d in decisions}
    for decision in sorted(decisions, key=lambda d: d.pressure, reverse=True):
        extra_wanted = decision.desired - floor[decision.pool]
        extra = max(0, min(extra_wanted, left // gpus[decision.pool]))
        left -= extra * gpus[decision.pool]
        granted = floor[decision.pool] + extra
        if granted < decision.desired:
            result[decision.pool] = replace(
                decision,
                desired=granted,
                action=_action(decision.current, granted),
                limited=True,
                reason=f"{decision.reason}; limited by the GPU budget of {budget}",
            )
    return [result[d.pool] for d in decisions]
