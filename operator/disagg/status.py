"""Pure status computation: observed children (and the previous status) become the new status.

The rules, as users see them in ``kubectl get dm`` and ``kubectl describe dm``:

* ``Ready`` is True only when each pool of the model's mode (prefill and decode, or the
  colocated engine pool) and (when enabled) the router have at least one ready replica.
* ``Progressing`` is True while a Deployment rolls out or moves toward its replica count.
* ``Degraded`` is True with reason ``ReplicaFailure`` when a Deployment cannot create its
  pods (a missing PriorityClass, a quota, Pod Security admission, a webhook: the
  controller's message says which), ``Unschedulable`` when pool pods cannot be placed (the
  scheduler's message says what is missing: GPUs, the RDMA resource, a node selector),
  ``ApplyRejected`` when the API server refused a child (its message), ``InvalidSpec``
  when the spec fails validation, and, for a model behind a Gateway (``spec.gateway``),
  ``GatewayAPIUnavailable`` when the cluster lacks the Gateway API, ``RouteNotAccepted`` or
  ``RouteRefsNotResolved`` when a Gateway's controller says so of the route.
* ``ScalingActive`` and ``ScalingLimited`` say what the last autoscaler evaluation found
  (:class:`ScalingRecord`); a pass without an evaluation keeps what the last one said.
* ``lastTransitionTime`` only moves when a condition's status changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import ValidationError

from disagg.api.resource import api_schema, known_fields
from disagg.api.status import (
    CONDITION_TYPES,
    AutoscalerMemory,
    Condition,
    ConditionType,
    DisaggregatedModelStatus,
    GatewayStatus,
    ObservedMetrics,
    PoolStatus,
    RouteParentStatus,
    RouterStatus,
    SloBudgetStatus,
)
from disagg.autoscale.recall import worth_saving
from disagg.clock import epoch_of
from disagg.rollout import (
    deployment_counts,
    replica_failures,
    rollout_pending,
    unschedulable_pods,
)

Obj = dict[str, Any]
MEMORY_KEY: Final = "autoscalerMemory"
Verdict = tuple[Literal["True", "False", "Unknown"], str, str]
"""A condition's (status, reason, message)."""


@dataclass(frozen=True)
class ScalingRecord:
    """What one autoscaler evaluation found, as status shows it."""

    active: Verdict
    """ScalingActive: tracking the SLOs, or holding replicas and why."""
    limited: Verdict | None = None
    """ScalingLimited; None keeps the previous one (an evaluation that read no metrics)."""
    scaled: Mapping[str, str] = field(default_factory=dict)
    """Pools resized by this evaluation, with the reason."""
    metrics: ObservedMetrics | None = None
    """The signals read; None keeps the previous ones."""
    budget: SloBudgetStatus | None = None
    """The SLOs' error budgets; None keeps the previous ones."""


@dataclass(frozen=True)
class ObservedRoute:
    """The model's HTTPRoute (spec.gateway): the Gateways it names, and what is live."""

    name: str
    parents: tuple[tuple[str, str, str | None], ...]
    """(namespace, name, listener) of each Gateway in spec.gateway.parentRefs."""
    live: Obj | None = None
    unavailable: str | None = None
    """Why the route could not be created (its API is not served), when it could not."""


@dataclass(frozen=True)
class Observed:
    """What the operator saw of one model's children."""

    generation: int
    deployments: dict[str, Obj | None]
    """The pools' and the router's Deployments by role (None when absent)."""
    pods: list[Obj] = field(default_factory=list)
    roles: tuple[str, ...] = ("prefill", "decode")
    """The pools that exist or are wanted: the mode's, and during a switch the old ones."""
    serving: tuple[str, ...] | None = None
    """The pools the router sends traffic to (None: ``roles``); Ready asks for these."""
    switching: str | None = None
    """What a mode switch under way waits for (:mod:`disagg.transition`)."""
    router_enabled: bool = True
    router_endpoint: str | None = None
    autoscaling_enabled: bool = False
    autoscaling_mode: str = "builtin"
    scaling: ScalingRecord | None = None
    """This pass's autoscaler evaluation; None when none was due."""
    memory: AutoscalerMemory | None = None
    """What the built-in autoscaler remembers (None: it runs no policy for this model)."""
    route: ObservedRoute | None = None
    """The route through the user's Gateway (None: spec.gateway is unset)."""


def pool_status(
    deployment: Obj | None, previous: PoolStatus | None, scaled: str | None, now: str
) -> PoolStatus:
    """A pool's counts; the last resize is this pass's (``scaled``, its reason) or the
    previous status's."""
    replicas, ready, desired = deployment_counts(deployment)
    return PoolStatus(
        replicas=replicas,
        ready_replicas=ready,
        desired_replicas=desired,
        summary=f"{ready}/{desired}",
        last_scale_time=now if scaled else previous.last_scale_time if previous else None,
        last_scale_reason=scaled or (previous.last_scale_reason if previous else None),
    )


def _condition(
    type_: ConditionType,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    generation: int,
    previous: Mapping[ConditionType, Condition],
    now: str,
) -> Condition:
    before = previous.get(type_)
    moved = before is None or before.status != status
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now if moved or before is None else before.last_transition_time,
        observed_generation=generation,
    )


def _joined(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _order(conditions: list[Condition]) -> list[Condition]:
    rank = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(conditions, key=lambda c: rank.get(c.type, len(rank)))


def compute_status(
    obs: Observed, previous: DisaggregatedModelStatus | None, now: str
) -> DisaggregatedModelStatus:
    """The full status of a model whose spec is valid."""
    prev_conditions = {c.type: c for c in (previous.conditions if previous else [])}
    scaled = obs.scaling.scaled if obs.scaling else {}
    pools = {
        role: pool_status(
            obs.deployments.get(role),
            getattr(previous, role, None) if previous else None,
            scaled.get(role),
            now,
        )
        for role in obs.roles
    }
    r_replicas, r_ready, _ = deployment_counts(obs.deployments.get("router"))
    router = RouterStatus(
        replicas=r_replicas,
        ready_replicas=r_ready,
        endpoint=obs.router_endpoint if obs.router_enabled else None,
    )
    gen = obs.generation

    serving = obs.serving or obs.roles
    not_ready = [r for r in serving if r not in pools or pools[r].ready_replicas < 1]
    if obs.router_enabled and r_ready < 1:
        not_ready.append("router")
    if not_ready:
        ready = _condition(
            "Ready",
            "False",
            "ComponentsNotReady",
            f"no ready replica yet in: {', '.join(not_ready)}",
            gen,
            prev_conditions,
            now,
        )
    else:
        ready = _condition(
            "Ready",
            "True",
            "AllComponentsReady",
            f"{_joined([*serving, *(['router'] if obs.router_enabled else [])])} "
            "have ready replicas",
            gen,
            prev_conditions,
            now,
        )

    roles = [*obs.roles, *(["router"] if obs.router_enabled else [])]
    rolling = [
        f"{role}: {why}" for role in roles if (why := rollout_pending(obs.deployments.get(role)))
    ]
    if obs.switching:
        progressing = _condition(
            "Progressing", "True", "SwitchingMode", "; ".join([obs.switching, *rolling]),
            gen, prev_conditions, now,
        )  # fmt: skip
    elif rolling:
        progressing = _condition(
            "Progressing", "True", "RollingOut", "; ".join(rolling), gen, prev_conditions, now
        )
    else:
        progressing = _condition(
            "Progressing",
            "False",
            "RolloutComplete",
            "every Deployment runs its desired replicas",
            gen,
            prev_conditions,
            now,
        )

    failed = replica_failures(obs.deployments)
    stuck = unschedulable_pods(obs.pods)
    gateway = gateway_status(obs.route)
    routing = route_problem(obs.route, gateway)
    if failed or stuck:
        reason = "ReplicaFailure" if failed else "Unschedulable"
        message = "; ".join([*failed, *stuck])
        degraded = _condition("Degraded", "True", reason, message, gen, prev_conditions, now)
    elif routing is not None:
        degraded = _condition("Degraded", "True", *routing, gen, prev_conditions, now)
    else:
        degraded = _condition("Degraded", "False", "AsExpected", "", gen, prev_conditions, now)

    scaling = _scaling_conditions(obs, prev_conditions, now)
    return DisaggregatedModelStatus(
        observed_generation=gen,
        conditions=_order([ready, progressing, degraded, *scaling]),
        prefill=pools.get("prefill"),
        decode=pools.get("decode"),
        engine=pools.get("engine"),
        router=router,
        gateway=gateway,
        metrics=_metrics(obs, previous),
        slo_budget=_budget(obs, previous),
        autoscaler_memory=(
            obs.memory if obs.autoscaling_enabled and obs.autoscaling_mode == "builtin" else None
        ),
    )


def gateway_status(route: ObservedRoute | None) -> GatewayStatus | None:
    """Each Gateway's verdict on the model's route, as its controller wrote it in the
    route's status (matched by namespace, name and listener; Unknown until it has)."""
    if route is None:
        return None
    live = route.live or {}
    namespace = live.get("metadata", {}).get("namespace", "")
    verdicts: dict[tuple[str, str, str | None], list[Obj]] = {}
    for entry in (live.get("status") or {}).get("parents") or []:
        ref = entry.get("parentRef") or {}
        key = (ref.get("namespace") or namespace, ref.get("name", ""), ref.get("sectionName"))
        verdicts.setdefault(key, entry.get("conditions") or [])
    return GatewayStatus(
        route=route.name if route.live is not None else None,
        parents=[_verdict(p, verdicts.get(p)) for p in route.parents],
    )


def _verdict(ref: tuple[str, str, str | None], conditions: list[Obj] | None) -> RouteParentStatus:
    namespace, name, listener = ref
    by_type = {c.get("type"): c for c in conditions or []}
    accepted, resolved = by_type.get("Accepted") or {}, by_type.get("ResolvedRefs") or {}
    said = [
        f"{c.get('type')} {c.get('status')}: {c.get('reason', '')}"
        + (f" ({c['message']})" if c.get("message") else "")
        for c in (accepted, resolved)
        if c and c.get("status") != "True"
    ]
    return RouteParentStatus(
        gateway=f"{namespace}/{name}" + (f"/{listener}" if listener else ""),
        accepted=_said(accepted),
        resolved_refs=_said(resolved),
        message="; ".join(said) or None,
    )


def _said(condition: Obj) -> str:
    status = condition.get("status")
    return status if status in ("True", "False") else "Unknown"


def route_problem(
    route: ObservedRoute | None, gateway: GatewayStatus | None
) -> tuple[str, str] | None:
    """Why the model is not reachable through its Gateway, as a Degraded (reason, message):
    the Gateway API is missing, or a Gateway refused the route or cannot resolve its
    backend. A Gateway that has not said yet is no problem."""
    if route is None or gateway is None:
        return None
    if route.unavailable is not None:
        return "GatewayAPIUnavailable", route.unavailable
    refused = [p for p in gateway.parents if p.accepted == "False"]
    if refused:
        return "RouteNotAccepted", "; ".join(
            f"Gateway {p.gateway} did not accept HTTPRoute {route.name}: {p.message}"
            for p in refused
        )
    unresolved = [p for p in gateway.parents if p.resolved_refs == "False"]
    if unresolved:
        return "RouteRefsNotResolved", "; ".join(
            f"Gateway {p.gateway} cannot resolve HTTPRoute {route.name}'s backend: {p.message}"
            for p in unresolved
        )
    return None


def route_events(
    previous: DisaggregatedModelStatus | None, status: DisaggregatedModelStatus
) -> list[Obj]:
    """A Normal Event for each Gateway that newly accepted the model's route with its
    backend resolved (a refusal is the Degraded condition's Warning)."""
    if status.gateway is None or status.gateway.route is None:
        return []
    earlier = previous.gateway.parents if previous and previous.gateway else []
    serving_before = {p.gateway for p in earlier if _serving(p)}
    return [
        {
            "type": "Normal",
            "reason": "RouteAccepted",
            "message": f"Gateway {p.gateway} accepted HTTPRoute {status.gateway.route}: the "
            "model is reachable through it",
        }
        for p in status.gateway.parents
        if _serving(p) and p.gateway not in serving_before
    ]


def _serving(parent: RouteParentStatus) -> bool:
    return parent.accepted == "True" and parent.resolved_refs == "True"


def _metrics(obs: Observed, previous: DisaggregatedModelStatus | None) -> ObservedMetrics:
    if not (obs.autoscaling_enabled and obs.autoscaling_mode == "builtin"):
        return ObservedMetrics()  # nobody reads Prometheus for this model: show nothing stale
    if obs.scaling is not None and obs.scaling.metrics is not None:
        return obs.scaling.metrics
    return previous.metrics if previous else ObservedMetrics()


def _budget(obs: Observed, previous: DisaggregatedModelStatus | None) -> SloBudgetStatus | None:
    if not (obs.autoscaling_enabled and obs.autoscaling_mode == "builtin"):
        return None  # nobody counts this model's requests
    if obs.scaling is not None and obs.scaling.budget is not None:
        return obs.scaling.budget
    return previous.slo_budget if previous else None


def _scaling_conditions(
    obs: Observed, prev: Mapping[ConditionType, Condition], now: str
) -> list[Condition]:
    """ScalingActive, and ScalingLimited while the builtin autoscaler runs."""
    gen = obs.generation
    if not obs.autoscaling_enabled:
        return [
            _condition(
                "ScalingActive", "False", "AutoscalingDisabled",
                "spec.autoscaling.enabled is false; pools keep spec replicas", gen, prev, now,
            )
        ]  # fmt: skip
    if obs.autoscaling_mode == "external":
        return [
            _condition(
                "ScalingActive", "True", "ExternalScaler",
                "replica counts are managed by the rendered KEDA ScaledObjects or HPAs",
                gen, prev, now,
            )
        ]  # fmt: skip
    record = obs.scaling
    if record is None:  # no evaluation this pass: what the last one said still holds
        active = prev.get("ScalingActive")
        if active is None or active.reason in ("AutoscalingDisabled", "ExternalScaler"):
            active = _condition(
                "ScalingActive", "Unknown", "AutoscalerStarting",
                "waiting for the first autoscaler evaluation", gen, prev, now,
            )  # fmt: skip
        limited = prev.get("ScalingLimited")
        return [active, *([limited] if limited else [])]
    conditions = [_condition("ScalingActive", *record.active, gen, prev, now)]
    if record.limited is not None:
        conditions.append(_condition("ScalingLimited", *record.limited, gen, prev, now))
    elif "ScalingLimited" in prev:
        conditions.append(prev["ScalingLimited"])
    return conditions


def invalid_status(
    problems: list[str],
    generation: int,
    previous: DisaggregatedModelStatus | None,
    now: str,
    reason: str = "InvalidSpec",
) -> DisaggregatedModelStatus:
    """Status of a model whose children cannot be brought in line (the spec is invalid, or
    the API server refused a child): Degraded with ``reason``, everything else as it was."""
    prev_conditions = {c.type: c for c in (previous.conditions if previous else [])}
    message = "; ".join(problems)
    degraded = _condition("Degraded", "True", reason, message, generation, prev_conditions, now)
    kept = [c for c in (previous.conditions if previous else []) if c.type != "Degraded"]
    base = previous or DisaggregatedModelStatus()
    return base.model_copy(update={"conditions": _order([*kept, degraded])})


def status_patch(old: Obj, new: Obj) -> Obj | None:
    """A JSON merge patch turning ``old`` into ``new`` (None when they are equal).

    Keys that disappeared are set to null, as a merge patch requires.
    """
    if old == new:
        return None
    patch: Obj = {}
    for key in old.keys() | new.keys():
        if key not in new:
            patch[key] = None
        elif key not in old:
            patch[key] = new[key]
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            sub = status_patch(old[key], new[key])
            if sub is not None:
                patch[key] = sub
        elif old[key] != new[key]:
            patch[key] = new[key]
    return patch or None


def worth_writing(patch: Obj | None, memory_age: float | None = None) -> bool:
    """Whether a status patch says anything but a new sample time or the autoscaler's
    recent history (see :func:`worth_saving`; ``memory_age``: how old the memory in status
    is) (pure)."""
    if not patch:
        return False
    metrics = patch.get("metrics")
    rest = {k: v for k, v in patch.items() if k not in ("metrics", MEMORY_KEY)}
    if rest or (isinstance(metrics, dict) and set(metrics) != {"observedAt"}):
        return True
    return MEMORY_KEY in patch and worth_saving(patch[MEMORY_KEY], memory_age)


def previous_status(raw: Obj | None) -> DisaggregatedModelStatus | None:
    """The status a model carries, parsed; None when it has none or someone wrote garbage
    into it (then it is computed from scratch). The autoscaler's memory is read on its own
    (:func:`disagg.autoscale.recall.recalled`): one that cannot be read costs what it
    learned, not the conditions' transition times."""
    rest = {k: v for k, v in (raw or {}).items() if k != MEMORY_KEY}
    if not rest:
        return None
    try:
        # Fields another operator version wrote that this one does not know (a rollback)
        # are left out, as the API server leaves out what the installed CRD does not know.
        schema = api_schema(DisaggregatedModelStatus)
        return DisaggregatedModelStatus.model_validate(known_fields(rest, schema))
    except ValidationError:
        return None


def memory_age(raw: Obj, now: float) -> float | None:
    """Seconds since the autoscaler's memory in this status was saved; None without one
    (or with a time that does not read as one)."""
    kept = raw.get(MEMORY_KEY)
    when = kept.get("savedAt") if isinstance(kept, dict) else None
    saved = epoch_of(when) if isinstance(when, str) else None
    return None if saved is None else now - saved
