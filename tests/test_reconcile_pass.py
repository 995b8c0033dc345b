"""The reconcile pass end to end against an in-memory API server and a scripted Prometheus:
children, Events, status, refusals, and the autoscaler's evaluations inside the pass, with
one writer of pool replicas and of status."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

import pytest

from conftest import load_example
from disagg.autoscale.policy import Signals
from disagg.autoscale.queries import Signal
from disagg.kube.client import KubeError
from disagg.kube.events import EventRecorder
from disagg.kube.informer import ChildCache
from disagg.kube.models import ModelStore
from disagg.naming import MANAGER
from disagg.reconcile.children import (
    HANDOVER_MANAGER,
    OPTIONAL_KINDS,
    WAKE_VIEWS,
    WATCHED_KINDS,
)
from disagg.reconcile.model import OBSERVE_WAIT_SECONDS, Outcome, Reconciler
from disagg.reconcile.prometheus import MetricsUnavailable, PrometheusSource
from disagg.status import worth_writing
from fakekube import FakeKube

Obj = dict[str, Any]
NS, NAME = "team", "qwen-small"
START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class ScriptedPrometheus(PrometheusSource):
    """Signals a test sets; every query is counted."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefill = Signals(p99=0.2, request_rate=1.0, queue=0.0, running=1.0, pods_reporting=1)
        self.decode = Signals(p99=0.01, request_rate=1.0, queue=0.0, running=4.0, kv_usage=0.1,
                              pods_reporting=1)  # fmt: skip
        self.down = False
        self.queries = 0
        self.clock: Clock | None = None

    async def signals(self, queries: dict[Signal, str], latency: Signal) -> Signals:
        self.queries += 1
        if self.down:
            raise MetricsUnavailable(f"cannot reach Prometheus at {self.url} (ConnectError)")
        chosen = self.prefill if latency == "ttftP99" else self.decode
        return Signals(**{**chosen.__dict__, "sampled_at": self.clock() if self.clock else 0.0})

    async def vector(self, promql: str, label: str = "pod") -> dict[str, float]:
        return {}


class World:
    """The fake API server, the scripted Prometheus, the operator's watch cache of the
    children and the reconciler over them."""

    def __init__(self, manifest: Obj, kube: FakeKube | None = None) -> None:
        self.kube = kube or FakeKube()
        self.clock = Clock()
        self.prometheus = ScriptedPrometheus("http://prometheus:9090")
        self.prometheus.clock = self.clock
        self.woken: list[tuple[str, str]] = []
        """The models the watches enqueued, in order."""
        self.cache = ChildCache(
            self.kube,  # type: ignore[arg-type]
            WATCHED_KINDS,
            self._wake,
            optional=OPTIONAL_KINDS,
            views=WAKE_VIEWS,
        )
        self.models = ModelStore(
            self.kube,  # type: ignore[arg-type]
            on_change=self._wake,
        )
        self._watching: list[asyncio.Task[None]] = []
        recorder = EventRecorder(self.kube, clock=self.clock)  # type: ignore[arg-type]
        self.reconciler = Reconciler(
            self.kube,  # type: ignore[arg-type]
            recorder,
            self.cache,
            self.models,
            clock=self.clock,
            prometheus=lambda url: self.prometheus,
        )
        body = copy.deepcopy(manifest)
        body["metadata"] |= {"namespace": NS, "uid": "model-uid", "generation": 1}
        self.kube.put(body)

    def _wake(self, namespace: str, model: str) -> None:
        self.woken.append((namespace, model))

    async def settle(self) -> None:
        """Start the watches if they are not running (the cache's, and the models' as kopf
        runs it in the operator); wait until they have read everything the API server sent."""
        if not self._watching:
            self._watching = [
                asyncio.create_task(self.cache.run()),
                asyncio.create_task(self._watch_models()),
            ]
            await self.cache.synced()
        await self.kube.delivered()

    async def _watch_models(self) -> None:
        async for event, obj in self.kube.watch("DisaggregatedModel", NS, None, "0"):
            if self.models.seen(event, obj):
                self.woken.append((NS, obj["metadata"]["name"]))

    async def reconcile(self) -> Outcome:
        """A pass, and when its status write waits for the Deployment controller, the pass
        that controller's answer wakes (the counts are both passes')."""
        await self.settle()
        outcome = await self.reconciler.reconcile(NS, NAME)
        if not outcome.status_waiting:
            return outcome
        await self.settle()
        after = await self.reconciler.reconcile(NS, NAME)
        return replace(
            after, applied=outcome.applied + after.applied, pruned=outcome.pruned + after.pruned,
            slo=outcome.slo or after.slo,
        )  # fmt: skip

    def model(self) -> Obj:
        obj = self.kube.stored("DisaggregatedModel", NS, NAME)
        assert obj is not None
        return obj

    def edit(self, change: Obj) -> None:
        """A user's edit of the spec: a new generation."""
        obj = self.model()
        obj["spec"] = _merged(obj["spec"], change)
        obj["metadata"]["generation"] += 1
        self.kube.put(obj)

    def condition(self, type_: str) -> Obj:
        return next(c for c in self.model()["status"]["conditions"] if c["type"] == type_)

    def deployment(self, role: str) -> Obj:
        obj = self.kube.stored("Deployment", NS, f"{NAME}-{role}")
        assert obj is not None
        return obj

    def pools_ready(self, *roles: str) -> None:
        """The Deployment controller and kubelets bring every replica of ``roles`` (default:
        prefill, decode and router) up."""
        for role in roles or ("prefill", "decode", "router"):
            dep = self.deployment(role)
            n = dep["spec"].get("replicas", 1)
            self.kube.set_status("Deployment", NS, dep["metadata"]["name"], {
                "observedGeneration": dep["metadata"]["generation"], "replicas": n,
                "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n,
            })  # fmt: skip

    def events(self, reason: str | None = None) -> list[Obj]:
        return [e for e in self.kube.events() if reason is None or e["reason"] == reason]


def _merged(base: Obj, change: Obj) -> Obj:
    result = dict(base)
    for key, value in change.items():
        result[key] = _merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return result


def autoscaled() -> Obj:
    manifest = load_example("minimal")
    manifest["spec"]["autoscaling"] = {
        "enabled": True, "ttftP99": "1s", "tpotP99": "50ms", "interval": "15s",
        "scaleUp": {"stabilizationWindow": "0s", "cooldown": "0s"},
    }  # fmt: skip
    return manifest


async def test_a_new_model_is_created_with_one_event_one_status_write_then_costs_nothing() -> None:
    world = World(load_example("minimal"))
    outcome = await world.reconcile()
    children = [w for w in world.kube.writes if w[1] == "apply"]
    assert outcome.applied == len(children) >= 10
    created = world.events("Created")
    assert len(world.events()) == 1 and len(created) == 1
    assert "Deployment qwen-small-prefill" in created[0]["message"]
    assert world.kube.writes_of("DisaggregatedModel") == [
        ("DisaggregatedModel", "patch-status", MANAGER)
    ]
    assert world.model()["status"]["observedGeneration"] == 1
    writes = len(world.kube.writes)
    assert outcome.requeue_after is None  # nothing to evaluate without autoscaling
    await world.reconcile()
    assert len(world.kube.writes) == writes, world.kube.writes[writes:]


async def test_a_new_models_children_are_sent_together_prerequisites_first() -> None:
    world = World(load_example("minimal"))
    outcome = await world.reconcile()  # the fake refuses a RoleBinding sent before its Role
    assert outcome.applied >= 10 and not outcome.invalid
    assert world.kube.peak_in_flight >= outcome.applied // 2


async def test_deployments_reporting_ready_make_the_model_ready_with_one_more_status_write() -> (
    None
):
    world = World(load_example("minimal"))
    await world.reconcile()
    world.pools_ready()
    writes = len(world.kube.writes)
    await world.reconcile()
    assert world.kube.writes[writes:] == [("DisaggregatedModel", "patch-status", MANAGER)]
    assert world.condition("Ready")["status"] == "True"
    assert world.condition("Progressing")["status"] == "False"


async def test_a_deleted_child_is_restored_and_an_unwanted_one_pruned() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    await world.kube.delete("Service", NS, f"{NAME}-decode")
    await world.reconcile()
    assert world.kube.stored("Service", NS, f"{NAME}-decode") is not None
    world.edit({"router": {"enabled": False}})
    await world.reconcile()
    assert world.kube.stored("Deployment", NS, f"{NAME}-router") is None
    deleted = world.events("Deleted")
    assert len(deleted) == 1 and "Deployment qwen-small-router" in deleted[0]["message"]


async def test_an_invalid_edit_changes_nothing_and_warns_once() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    children = {k: copy.deepcopy(v) for k, v in world.kube.objects.items() if k[0] != "Event"}
    world.edit({"prefill": {"tensorParallelSize": 0}})
    for _ in range(3):
        outcome = await world.reconcile()
        assert outcome.invalid
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "tensorParallelSize" in degraded["message"]
    assert len(world.events("InvalidSpec")) == 1
    for key, before in children.items():
        if key[0] != "DisaggregatedModel":
            assert world.kube.objects[key] == before, key


async def test_a_model_stored_with_a_renamed_field_keeps_serving_and_says_where_it_went() -> None:
    # An SGLang model stored before spec.engine became spec.runtime: were the old field read
    # as absent, the model would be re-rendered with the default backend, vLLM.
    manifest = load_example("sglang-mooncake")
    manifest["metadata"]["name"] = NAME
    world = World(manifest)
    await world.reconcile()
    children = {k: copy.deepcopy(v) for k, v in world.kube.objects.items() if k[0] != "Event"}

    def rename(old: str, new: str) -> None:
        stored = world.model()
        stored["spec"][new] = stored["spec"].pop(old)
        stored["metadata"]["generation"] += 1
        world.kube.put(stored)

    rename("runtime", "engine")
    outcome = await world.reconcile()
    assert outcome.invalid
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "spec.engine: engine was renamed runtime" in degraded["message"]
    for key, before in children.items():
        if key[0] != "DisaggregatedModel":
            assert world.kube.objects[key] == before, key
    rename("engine", "runtime")
    outcome = await world.reconcile()
    assert not outcome.invalid and world.condition("Degraded")["status"] == "False"


async def test_a_refused_child_degrades_the_model_once_and_a_later_pass_recovers() -> None:
    world = World(load_example("minimal"))
    world.kube.fail_next("Deployment", "apply", 422, 'Deployment "qwen-small-prefill" is invalid')
    outcome = await world.reconcile()
    assert outcome.invalid
    assert world.condition("Degraded")["reason"] == "ApplyRejected"
    assert len(world.events("ApplyRejected")) == 1
    await world.reconcile()
    assert world.condition("Degraded")["status"] == "False"
    assert world.kube.stored("Deployment", NS, f"{NAME}-prefill") is not None


async def test_an_evaluation_is_due_once_per_interval_and_its_resize_is_one_apply_by_the_operator() -> (
    None
):
    world = World(autoscaled())
    first = await world.reconcile()
    assert first.requeue_after == 15.0  # the pools did not exist: nothing was evaluated yet
    assert world.prometheus.queries == 0
    assert world.condition("ScalingActive")["reason"] == "AutoscalerStarting"
    world.pools_ready()
    await world.reconcile()  # not due yet: reads no metrics
    assert world.prometheus.queries == 0
    world.prometheus.prefill = Signals(p99=6.0, request_rate=20.0, queue=40.0, running=8.0,
                                       pods_reporting=1)  # fmt: skip
    world.clock.now += 15
    writes = len(world.kube.writes)
    outcome = await world.reconcile()
    assert world.prometheus.queries == 2  # one evaluation: both pools
    assert outcome.requeue_after == 15.0
    grown = world.deployment("prefill")["spec"]["replicas"]
    assert grown > 1
    new_writes = world.kube.writes[writes:]
    replica_writes = [w for w in new_writes if w[0] == "Deployment"]
    assert replica_writes == [("Deployment", "apply", MANAGER)], new_writes
    status = world.model()["status"]
    assert status["prefill"]["desiredReplicas"] == grown
    assert "scale up" in status["prefill"]["lastScaleReason"]
    assert status["metrics"]["ttftP99"] == "6s"
    assert world.condition("ScalingActive")["reason"] == "SLOTracking"
    scaled = world.events("ScaledUp")
    assert len(scaled) == 1 and scaled[0]["message"].startswith(f"prefill 1 -> {grown}")
    assert not world.events("Updated")  # the resize is reported once, as ScaledUp
    assert [w for w in new_writes if w[0] == "DisaggregatedModel"] == [
        ("DisaggregatedModel", "patch-status", MANAGER)
    ]
    # A child event a second later runs the pass again: no evaluation, no write.
    world.clock.now += 1
    writes = len(world.kube.writes)
    again = await world.reconcile()
    assert world.prometheus.queries == 2 and again.requeue_after == 14.0
    assert world.kube.writes[writes:] == []
    assert world.deployment("prefill")["spec"]["replicas"] == grown


async def test_between_evaluations_a_pool_keeps_its_live_size_and_a_new_pool_the_spec_size() -> (
    None
):
    world = World(autoscaled())
    await world.reconcile()
    assert world.deployment("prefill")["spec"]["replicas"] == 1
    await world.kube.patch("Deployment", NS, f"{NAME}-prefill", {"spec": {"replicas": 3}})
    writes = len(world.kube.writes)
    await world.reconcile()
    assert world.deployment("prefill")["spec"]["replicas"] == 3
    assert all(w[0] != "Deployment" or w[2] == MANAGER for w in world.kube.writes[writes:])


async def test_missing_metrics_hold_replicas_and_warn_once() -> None:
    world = World(autoscaled())
    await world.reconcile()
    world.pools_ready()
    world.prometheus.down = True
    for _ in range(3):
        world.clock.now += 15
        await world.reconcile()
    active = world.condition("ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "MetricsUnavailable")
    assert "cannot reach Prometheus" in active["message"]
    assert len(world.events("MetricsUnavailable")) == 1
    assert world.deployment("prefill")["spec"]["replicas"] == 1
    world.prometheus.down = False
    world.clock.now += 15
    await world.reconcile()
    assert world.condition("ScalingActive")["reason"] == "SLOTracking"


async def test_a_status_conflict_reruns_the_pass_and_the_resize_still_reaches_status() -> None:
    world = World(autoscaled())
    await world.reconcile()
    world.pools_ready()
    world.prometheus.prefill = Signals(p99=6.0, request_rate=20.0, queue=40.0, running=8.0,
                                       pods_reporting=1)  # fmt: skip
    world.clock.now += 15
    world.kube.fail_next("DisaggregatedModel", "patch-status", 409)
    outcome = await world.reconcile()
    assert outcome.conflict and not outcome.status_written
    assert "lastScaleTime" not in world.model()["status"]["prefill"]
    world.clock.now += 1
    await world.reconcile()  # the rerun: not due, but the evaluation is still recorded
    prefill = world.model()["status"]["prefill"]
    assert "scale up" in prefill["lastScaleReason"]
    assert prefill["desiredReplicas"] == world.deployment("prefill")["spec"]["replicas"] > 1


async def test_switching_to_an_external_scaler_keeps_the_pool_size_and_switching_back_prunes_it() -> (
    None
):
    world = World(autoscaled())
    await world.reconcile()
    await world.kube.patch("Deployment", NS, f"{NAME}-decode", {"spec": {"replicas": 4}})
    await world.reconcile()  # the operator applies the live size: it owns replicas again
    world.edit({"autoscaling": {"mode": "external"}})
    await world.reconcile()
    # Without the hand-over, server-side apply would drop the field and the pool would
    # fall back to one replica until KEDA acted.
    assert world.deployment("decode")["spec"]["replicas"] == 4
    assert ("Deployment", "apply", HANDOVER_MANAGER) in world.kube.writes
    assert world.kube.stored("ScaledObject", NS, f"{NAME}-decode") is not None
    assert world.condition("ScalingActive")["reason"] == "ExternalScaler"
    writes = len(world.kube.writes)
    await world.reconcile()
    assert world.kube.writes[writes:] == []  # external mode: nothing to do on a resync
    world.edit({"autoscaling": {"mode": "builtin"}})
    await world.reconcile()
    assert world.kube.stored("ScaledObject", NS, f"{NAME}-decode") is None
    assert world.deployment("decode")["spec"]["replicas"] == 4


async def test_a_deleted_model_forgets_its_autoscaler_memory() -> None:
    world = World(autoscaled())
    await world.reconcile()
    assert (NS, NAME) in world.reconciler.scalers
    await world.kube.delete("DisaggregatedModel", NS, NAME)
    assert (await world.reconcile()).gone
    assert (NS, NAME) not in world.reconciler.scalers


def test_a_new_sample_time_alone_is_not_worth_a_status_write() -> None:
    assert not worth_writing(None)
    assert not worth_writing({"metrics": {"observedAt": "2026-12-01T00:00:15Z"}})
    assert worth_writing({"metrics": {"observedAt": "t", "ttftP99": "2s"}})
    assert worth_writing({"observedGeneration": 2})


SLOW_PROMPTS = ((1.0, 90.0), (2.5, 95.0), (10.0, 100.0), (float("inf"), 100.0))
"""A prefill-time histogram where 6% of prompts need more than a 3 s SLO on their own."""


async def test_an_unreachable_ttft_is_reported_once_and_adds_no_replicas() -> None:
    manifest = autoscaled()
    manifest["spec"]["model"] = {"name": "meta-llama/Llama-3.1-70B-Instruct"}
    manifest["spec"]["prefill"] = {"replicas": 2, "tensorParallelSize": 8}
    manifest["spec"]["decode"] = {"replicas": 1, "tensorParallelSize": 8}
    manifest["spec"]["autoscaling"]["ttftP99"] = "3s"
    world = World(manifest)
    await world.reconcile()
    world.pools_ready()
    world.prometheus.prefill = Signals(
        p99=6.0, request_rate=0.2, queue=0.0, running=1.0, pods_reporting=2,
        prompt_tokens_rate=2000.0, prefill_seconds=1.2, prefill_buckets=SLOW_PROMPTS,
    )  # fmt: skip
    for _ in range(3):
        world.clock.now += 15
        await world.reconcile()
    limited = world.condition("ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "SLOUnreachable")
    assert "prefill:" in limited["message"] and "on TP8" in limited["message"]
    assert "TP32 would serve them" in limited["message"]  # up to 10 s against 3 s
    assert len(world.events("SLOUnreachable")) == 1
    # More replicas cannot help those prompts: the prefill pool is not scaled for them.
    assert world.deployment("prefill")["spec"]["replicas"] == 2


async def test_a_query_reporting_what_no_engine_does_holds_its_pool_and_warns_once() -> None:
    world = World(autoscaled())
    await world.reconcile()
    world.pools_ready()
    before = world.deployment("decode")["spec"]["replicas"]
    # A kvUsage query overridden to report percent: 97 would read as the cache 97x full.
    world.prometheus.decode = Signals(
        p99=0.02, request_rate=5.0, queue=0.0, running=40.0, kv_usage=97.0,
        pods_reporting=before,
    )  # fmt: skip
    for _ in range(3):
        world.clock.now += 15
        await world.reconcile()
    assert world.deployment("decode")["spec"]["replicas"] == before
    active = world.condition("ScalingActive")["message"]
    assert "decode: holding: metrics invalid: kvUsage is 97, not a fraction" in active
    warnings = world.events("MetricsInvalid")
    assert len(warnings) == 1 and "see spec.autoscaling.queries" in warnings[0]["message"]


async def test_a_first_pass_cut_short_before_its_status_converges_on_the_next() -> None:
    world = World(load_example("minimal"))
    world.kube.fail_next("DisaggregatedModel", "patch-status", 503)
    with pytest.raises(KubeError, match="503"):  # the queue retries it with backoff
        await world.reconcile()
    assert world.kube.stored("Deployment", NS, f"{NAME}-prefill") is not None
    assert not world.model().get("status")
    await world.reconcile()  # children already there: applying them again changes nothing
    assert world.model()["status"]["observedGeneration"] == 1
    writes = len(world.kube.writes)
    await world.reconcile()
    assert world.kube.writes[writes:] == []


async def test_a_new_models_status_waits_for_the_deployment_controller_and_is_written_once() -> (
    None
):
    world = World(load_example("minimal"))
    await world.settle()
    first = await world.reconciler.reconcile(NS, NAME)
    assert first.status_waiting and first.requeue_after == OBSERVE_WAIT_SECONDS
    assert world.kube.writes_of("DisaggregatedModel") == []
    await world.settle()
    assert world.woken == [(NS, NAME)] * 3  # the controller observed each Deployment
    second = await world.reconciler.reconcile(NS, NAME)
    assert second.status_written and second.applied == 0
    assert "rollout pending" not in world.condition("Progressing")["message"]
    assert world.kube.writes_of("DisaggregatedModel") == [
        ("DisaggregatedModel", "patch-status", MANAGER)
    ]


def idle_model() -> Obj:
    """The minimal model with both pools at zero replicas and no router: nothing to roll
    out, so its status is written at once, and no controller has news of a child."""
    manifest = load_example("minimal")
    manifest["spec"] |= {
        "prefill": {"replicas": 0},
        "decode": {"replicas": 0},
        "router": {"enabled": False},
    }
    return manifest


async def test_a_model_scaled_to_zero_writes_its_status_at_once_and_only_once() -> None:
    world = World(idle_model())
    await world.settle()
    outcome = await world.reconciler.reconcile(NS, NAME)
    # The Deployment controller has yet to observe either pool; nothing it does starts a pod.
    assert outcome.status_written and not outcome.status_waiting
    assert world.model()["status"]["observedGeneration"] == 1
    assert world.condition("Progressing")["status"] == "False"
    await world.settle()
    for role in ("prefill", "decode"):  # the controller has observed both pools since
        deployment = world.deployment(role)
        assert deployment["status"]["observedGeneration"] == deployment["metadata"]["generation"]
    writes = len(world.kube.writes)
    await world.reconciler.reconcile(NS, NAME)
    assert world.kube.writes[writes:] == []


async def test_with_the_deployment_controller_down_the_status_is_written_after_the_wait() -> None:
    world = World(load_example("minimal"))
    world.kube.deployment_controller = False
    await world.settle()
    assert (await world.reconciler.reconcile(NS, NAME)).requeue_after == OBSERVE_WAIT_SECONDS
    world.clock.now += 2
    assert (await world.reconciler.reconcile(NS, NAME)).requeue_after == OBSERVE_WAIT_SECONDS - 2
    assert world.kube.writes_of("DisaggregatedModel") == []
    world.clock.now += OBSERVE_WAIT_SECONDS - 2
    assert (await world.reconciler.reconcile(NS, NAME)).status_written
    assert world.model()["status"]["observedGeneration"] == 1
    assert "rollout pending" in world.condition("Progressing")["message"]


async def test_a_refused_child_is_reported_without_waiting_for_the_deployment_controller() -> None:
    world = World(load_example("minimal"))
    world.kube.deployment_controller = False
    world.kube.fail_next("PodDisruptionBudget", "apply", 422, "minAvailable: Invalid value")
    await world.settle()
    outcome = await world.reconciler.reconcile(NS, NAME)
    assert outcome.status_written and not outcome.status_waiting
    assert world.condition("Degraded")["reason"] == "ApplyRejected"


async def test_a_model_behind_a_gateway_serves_without_the_gateway_api_and_reports_its_route() -> (
    None
):
    manifest = load_example("minimal")
    manifest["spec"]["gateway"] = {"parentRefs": [{"name": "edge", "namespace": "gw"}]}
    world = World(manifest)
    route_name = f"{NAME}-router"
    # No Gateway API in the cluster: the route's apply answers 404.
    world.kube.fail_next(
        "HTTPRoute", "apply", 404, "the server could not find the requested resource"
    )
    outcome = await world.reconcile()
    assert not outcome.invalid
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "GatewayAPIUnavailable")
    assert "gateway.networking.k8s.io/v1 HTTPRoute" in degraded["message"]
    assert len(world.events("GatewayAPIUnavailable")) == 1
    for role in ("prefill", "decode", "router"):
        assert world.deployment(role) is not None  # the engines and the router serve anyway
    assert world.kube.stored("HTTPRoute", NS, route_name) is None
    # The CRDs are installed: the next pass creates the route; no Gateway has said anything.
    await world.reconcile()
    route = world.kube.stored("HTTPRoute", NS, route_name)
    assert route is not None and route["spec"]["parentRefs"][0]["name"] == "edge"
    assert world.condition("Degraded")["status"] == "False"
    assert world.model()["status"]["gateway"] == {
        "route": route_name,
        "parents": [{"gateway": "gw/edge", "accepted": "Unknown", "resolvedRefs": "Unknown"}],
    }
    # The Gateway's controller accepts it: the watch wakes the model, status and an Event say so.
    world.woken.clear()
    world.kube.set_status("HTTPRoute", NS, route_name, {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge",
                      "namespace": "gw"},
        "controllerName": "example.net/gateway",
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": ""},
        ],
    }]})  # fmt: skip
    await world.settle()
    assert (NS, NAME) in world.woken
    await world.reconcile()
    assert world.model()["status"]["gateway"]["parents"][0]["accepted"] == "True"
    (accepted,) = world.events("RouteAccepted")
    assert "gw/edge" in accepted["message"]
    # spec.gateway removed: the route goes.
    obj = world.model()
    del obj["spec"]["gateway"]
    obj["metadata"]["generation"] += 1
    world.kube.put(obj)
    outcome = await world.reconcile()
    assert outcome.pruned == 1 and world.kube.stored("HTTPRoute", NS, route_name) is None
    assert "gateway" not in world.model()["status"]


async def test_an_inference_pool_model_degrades_without_the_extension_and_a_switch_back_prunes_the_pool() -> (
    None
):
    manifest = load_example("minimal")
    manifest["spec"]["gateway"] = {"parentRefs": [{"name": "edge"}]}
    manifest["spec"]["router"] = {"kind": "inferencePool"}
    world = World(manifest)
    world.kube.fail_next(
        "InferencePool", "apply", 404, "the server could not find the requested resource"
    )
    outcome = await world.reconcile()
    assert not outcome.invalid
    degraded = world.condition("Degraded")
    assert degraded["reason"] == "GatewayAPIUnavailable"
    assert "inference.networking.k8s.io/v1 InferencePool" in degraded["message"]
    assert "Inference Extension" in degraded["message"]
    assert world.kube.stored("HTTPRoute", NS, f"{NAME}-router") is not None  # its API is served
    picker = world.deployment("router")["spec"]["template"]["spec"]["containers"][0]
    assert picker["name"] == "epp"
    await world.reconcile()
    assert world.kube.stored("InferencePool", NS, NAME) is not None
    assert world.condition("Degraded")["status"] == "False"
    assert world.model()["status"]["router"].get("endpoint") is None  # no OpenAI API in-cluster
    # Back to the builtin router: the pool goes, the router and its Service come back.
    obj = world.model()
    obj["spec"]["router"] = {"kind": "builtin"}
    obj["metadata"]["generation"] += 1
    world.kube.put(obj)
    outcome = await world.reconcile()
    assert world.kube.stored("InferencePool", NS, NAME) is None
    assert (
        world.deployment("router")["spec"]["template"]["spec"]["containers"][0]["name"] == "router"
    )
    assert "initContainers" not in world.deployment("decode")["spec"]["template"]["spec"]
    route = world.kube.stored("HTTPRoute", NS, f"{NAME}-router")
    assert (
        route is not None
        and route["spec"]["rules"][0]["backendRefs"][0]["name"] == f"{NAME}-router"
    )
