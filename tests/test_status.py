"""Status computation: what `kubectl get dm` and the conditions say about observed children."""

from __future__ import annotations

from typing import Any

from disagg.api.status import DisaggregatedModelStatus
from disagg.status import Observed, compute_status, invalid_status, status_patch

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _deployment(replicas: int, ready: int, *, updated: int | None = None, generation: int = 1,
                observed: int = 1) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
            "observedGeneration": observed,
        },
    }


def _healthy() -> dict[str, dict[str, Any] | None]:
    return {"prefill": _deployment(2, 2), "decode": _deployment(3, 3), "router": _deployment(1, 1)}


def _cond(status: DisaggregatedModelStatus, type_: str) -> Any:
    return next(c for c in status.conditions if c.type == type_)


def test_all_ready() -> None:
    status = compute_status(Observed(generation=4, deployments=_healthy()), None, T0)
    assert _cond(status, "Ready").status == "True"
    assert _cond(status, "Progressing").status == "False"
    assert _cond(status, "Degraded").status == "False"
    assert status.prefill.summary == "2/2" and status.decode.summary == "3/3"
    assert status.observed_generation == 4
    assert all(c.observed_generation == 4 for c in status.conditions)
    assert [c.type for c in status.conditions] == [
        "Ready",
        "Progressing",
        "Degraded",
        "ScalingActive",
    ]


def test_not_ready_names_the_missing_component() -> None:
    deployments = _healthy()
    deployments["decode"] = _deployment(2, 0)
    status = compute_status(Observed(generation=1, deployments=deployments), None, T0)
    ready = _cond(status, "Ready")
    assert ready.status == "False" and ready.message == "no ready replica yet in: decode"
    assert _cond(status, "Progressing").message == "decode: 0/2 ready"


def test_router_only_counts_when_enabled() -> None:
    deployments = _healthy()
    deployments["router"] = None
    off = compute_status(
        Observed(generation=1, deployments=deployments, router_enabled=False), None, T0
    )
    assert _cond(off, "Ready").status == "True"
    on = compute_status(
        Observed(generation=1, deployments=deployments, router_enabled=True), None, T0
    )
    assert "router" in _cond(on, "Ready").message


def test_rollout_in_progress() -> None:
    deployments = _healthy()
    deployments["prefill"] = _deployment(2, 2, updated=1, generation=3, observed=3)
    status = compute_status(Observed(generation=1, deployments=deployments), None, T0)
    progressing = _cond(status, "Progressing")
    assert progressing.status == "True" and progressing.reason == "RollingOut"
    assert "prefill: 1/2 updated" in progressing.message
    stale = {**_healthy(), "decode": _deployment(3, 3, generation=5, observed=4)}
    assert (
        "decode: rollout pending"
        in _cond(compute_status(Observed(1, stale), None, T0), "Progressing").message
    )


def test_a_pool_at_zero_replicas_has_nothing_to_roll_out_before_its_controller_acts() -> None:
    new = {"metadata": {"generation": 1}, "spec": {"replicas": 0}}
    deployments = {**_healthy(), "prefill": new, "decode": new}
    status = compute_status(Observed(generation=1, deployments=deployments), None, T0)
    assert _cond(status, "Progressing").status == "False"
    # Scaled to zero, but the controller has yet to remove its pods: still rolling out.
    draining = _deployment(0, 0, generation=2, observed=1)
    draining["status"]["replicas"] = 2
    stale = compute_status(Observed(1, {**_healthy(), "decode": draining}), None, T0)
    assert "decode: rollout pending" in _cond(stale, "Progressing").message


def test_unschedulable_pods_degrade_with_the_scheduler_message() -> None:
    pod = {
        "metadata": {"name": "m-prefill-abc", "labels": {"disagg.dev/role": "prefill"}},
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                   "message": "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."}]},
    }  # fmt: skip
    status = compute_status(Observed(generation=1, deployments=_healthy(), pods=[pod]), None, T0)
    degraded = _cond(status, "Degraded")
    assert degraded.status == "True" and degraded.reason == "Unschedulable"
    assert (
        degraded.message
        == "prefill pod m-prefill-abc: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    )


def test_a_deployment_that_cannot_create_pods_degrades_with_the_controllers_message() -> None:
    # What the ReplicaSet controller reports when admission refuses the pods.
    refused = _deployment(1, 0)
    refused["status"]["conditions"] = [{
        "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
        "message": 'pods "m-decode-7d9f" is forbidden: no PriorityClass with name '
                   "inference-critical was found",
    }]  # fmt: skip
    deployments = {**_healthy(), "decode": refused}
    status = compute_status(Observed(generation=1, deployments=deployments), None, T0)
    degraded = _cond(status, "Degraded")
    assert degraded.status == "True" and degraded.reason == "ReplicaFailure"
    assert degraded.message.startswith("decode: pods ")
    assert "no PriorityClass with name inference-critical" in degraded.message
    # Once the controller creates the pods again, the condition clears.
    healed = compute_status(Observed(generation=1, deployments=_healthy()), status, T1)
    assert _cond(healed, "Degraded").status == "False"


def test_transition_time_moves_only_when_status_changes() -> None:
    first = compute_status(Observed(generation=1, deployments=_healthy()), None, T0)
    same = compute_status(Observed(generation=2, deployments=_healthy()), first, T1)
    assert _cond(same, "Ready").last_transition_time == T0
    broken = {**_healthy(), "prefill": _deployment(1, 0)}
    changed = compute_status(Observed(generation=2, deployments=broken), first, T1)
    assert _cond(changed, "Ready").last_transition_time == T1


def test_scaling_conditions_by_mode() -> None:
    off = compute_status(Observed(generation=1, deployments=_healthy()), None, T0)
    assert _cond(off, "ScalingActive").reason == "AutoscalingDisabled"
    starting = compute_status(
        Observed(generation=1, deployments=_healthy(), autoscaling_enabled=True), None, T0
    )
    assert (_cond(starting, "ScalingActive").status, _cond(starting, "ScalingActive").reason) == (
        "Unknown",
        "AutoscalerStarting",
    )
    # What the autoscaler wrote survives the reconciler's recomputation.
    tracked = starting.model_copy(
        update={
            "conditions": [
                *[c for c in starting.conditions if c.type != "ScalingActive"],
                _cond(starting, "ScalingActive").model_copy(
                    update={"status": "False", "reason": "MetricsUnavailable"}
                ),
            ]
        }
    )
    again = compute_status(
        Observed(generation=1, deployments=_healthy(), autoscaling_enabled=True), tracked, T1
    )
    assert _cond(again, "ScalingActive").reason == "MetricsUnavailable"
    external = compute_status(
        Observed(
            generation=1,
            deployments=_healthy(),
            autoscaling_enabled=True,
            autoscaling_mode="external",
        ),
        None,
        T0,
    )
    assert _cond(external, "ScalingActive").reason == "ExternalScaler"


def test_invalid_spec_keeps_other_conditions_and_sets_degraded() -> None:
    good = compute_status(Observed(generation=1, deployments=_healthy()), None, T0)
    bad = invalid_status(["spec.x: unknown field"], 2, good, T1)
    degraded = _cond(bad, "Degraded")
    assert degraded.status == "True" and degraded.reason == "InvalidSpec"
    assert degraded.message == "spec.x: unknown field" and degraded.observed_generation == 2
    assert _cond(bad, "Ready").status == "True"
    assert bad.observed_generation == 1, "an invalid generation was not reconciled"


def test_status_patch_nulls_removed_keys_and_is_none_when_equal() -> None:
    assert status_patch({"a": 1}, {"a": 1}) is None
    assert status_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2}}) == {
        "b": {"d": None}
    }
    assert status_patch({}, {"x": [1]}) == {"x": [1]}


def _route(
    *verdicts: tuple[str, str, str], unavailable: str | None = None, live: bool = True
) -> Any:
    from disagg.status import ObservedRoute

    conditions = [
        {"type": type_, "status": status, "reason": reason, "message": f"{type_} says {reason}"}
        for type_, status, reason in verdicts
    ]
    body = {
        "metadata": {"name": "m-router", "namespace": "team"},
        "status": {
            "parents": [
                {
                    "parentRef": {"name": "edge", "namespace": "gw", "sectionName": "https"},
                    "controllerName": "example.net/gateway",
                    "conditions": conditions,
                }
            ]
        },
    }
    return ObservedRoute(
        "m-router", (("gw", "edge", "https"),), body if live else None, unavailable
    )


def test_a_gateways_verdict_on_the_route_shows_in_status_and_degrades_when_refused() -> None:
    from disagg.status import route_events

    def status(route: Any, previous: Any = None) -> DisaggregatedModelStatus:
        return compute_status(
            Observed(generation=1, deployments=_healthy(), route=route), previous, T0
        )

    waiting = status(_route())
    assert waiting.gateway is not None and waiting.gateway.route == "m-router"
    (parent,) = waiting.gateway.parents
    assert (parent.gateway, parent.accepted, parent.resolved_refs) == (
        "gw/edge/https",
        "Unknown",
        "Unknown",
    )
    assert _cond(waiting, "Degraded").status == "False"  # the controller has not said yet
    assert route_events(None, waiting) == []

    serving = status(
        _route(("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")), waiting
    )
    assert serving.gateway is not None and serving.gateway.parents[0].accepted == "True"
    assert _cond(serving, "Degraded").status == "False"
    (event,) = route_events(waiting, serving)
    assert event["reason"] == "RouteAccepted" and "gw/edge/https" in event["message"]
    assert route_events(serving, serving) == []  # said once

    refused = status(
        _route(
            ("Accepted", "False", "NotAllowedByListeners"), ("ResolvedRefs", "True", "ResolvedRefs")
        ),
        serving,
    )
    degraded = _cond(refused, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "RouteNotAccepted")
    assert "gw/edge/https" in degraded.message and "NotAllowedByListeners" in degraded.message
    assert _cond(refused, "Ready").status == "True"  # in-cluster it still serves

    unresolved = status(
        _route(("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "RefNotPermitted"))
    )
    assert _cond(unresolved, "Degraded").reason == "RouteRefsNotResolved"
    assert "RefNotPermitted" in _cond(unresolved, "Degraded").message


def test_a_cluster_without_the_gateway_api_degrades_the_model_naming_what_is_missing() -> None:
    missing = "the cluster does not serve gateway.networking.k8s.io/v1 HTTPRoute: install it"
    status = compute_status(
        Observed(
            generation=1, deployments=_healthy(), route=_route(unavailable=missing, live=False)
        ),
        None,
        T0,
    )
    degraded = _cond(status, "Degraded")
    assert (degraded.status, degraded.reason, degraded.message) == (
        "True",
        "GatewayAPIUnavailable",
        missing,
    )
    assert _cond(status, "Ready").status == "True"
    assert status.gateway is not None and status.gateway.route is None
    # A model without spec.gateway says nothing of one.
    assert compute_status(Observed(generation=1, deployments=_healthy()), None, T0).gateway is None
