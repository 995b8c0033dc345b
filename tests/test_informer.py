"""The operator's watch cache of its children against an in-memory API server: what a pass
reads instead of listing, what wakes a model, and how it recovers when a watch breaks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from conftest import load_example
from disagg.kube.client import KubeError
from disagg.kube.informer import ChildCache, NotSynced
from disagg.naming import MANAGER, labels
from disagg.reconcile.children import OPTIONAL_KINDS, WAKE_VIEWS, WATCHED_KINDS
from fakekube import FakeKube
from test_control_loops import until
from test_reconcile_pass import NAME, NS, World, idle_model

Obj = dict[str, Any]


def pod(name: str, model: str = "llama", **meta: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels(model, "decode"), **meta},
    }


class Cluster:
    """A fake API server and a running cache over it, with the models it woke."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.woken: list[str] = []
        self.cache = ChildCache(
            self.kube,  # type: ignore[arg-type]
            WATCHED_KINDS,
            lambda namespace, model: self.woken.append(model),
            optional=OPTIONAL_KINDS,
            views=WAKE_VIEWS,
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.cache.run())
        await self.cache.synced()

    async def settle(self) -> None:
        await self.kube.delivered()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    world = Cluster()
    yield world
    if world.task is not None:
        world.task.cancel()
        await asyncio.gather(world.task, return_exceptions=True)


async def test_a_pass_reads_what_was_listed_and_what_the_watch_brought(cluster: Cluster) -> None:
    cluster.kube.put(pod("llama-decode-0"))
    await cluster.start()
    cluster.kube.put(pod("llama-decode-1"))
    cluster.kube.put(pod("mistral-decode-0", model="mistral"))
    await cluster.settle()
    assert [p["metadata"]["name"] for p in cluster.cache.pods(NS, "llama")] == [
        "llama-decode-0", "llama-decode-1",
    ]  # fmt: skip
    assert cluster.woken == ["llama", "llama", "mistral"]
    await cluster.kube.delete("Pod", NS, "llama-decode-0")
    await cluster.settle()
    assert [p["metadata"]["name"] for p in cluster.cache.pods(NS, "llama")] == ["llama-decode-1"]
    assert cluster.woken[-1] == "llama"


async def test_objects_without_the_childrens_labels_are_never_streamed(cluster: Cluster) -> None:
    await cluster.start()
    unrelated = pod("someone-elses-job")
    unrelated["metadata"]["labels"] = {"app": "training"}
    cluster.kube.put(unrelated)
    await cluster.settle()
    assert len(cluster.cache) == 0 and cluster.woken == []


async def test_a_write_the_pass_recorded_is_not_undone_by_its_echo_or_a_stale_event(
    cluster: Cluster,
) -> None:
    await cluster.start()
    before = cluster.kube.put(pod("llama-decode-0"))
    await cluster.settle()
    woken = len(cluster.woken)
    after = await cluster.kube.patch("Pod", NS, "llama-decode-0", {"metadata": {"annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "-100",
    }}})  # fmt: skip
    cluster.cache.record({**after, "kind": "Pod"})
    await cluster.settle()  # the watch delivers the same version: nothing new
    cluster.kube.send("Pod", "MODIFIED", before)  # a late event of the older version
    await cluster.settle()
    (cached,) = cluster.cache.pods(NS, "llama")
    assert cached["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == "-100"
    assert len(cluster.woken) == woken


async def test_the_deployment_controllers_bookkeeping_wakes_nobody_its_counts_do(
    cluster: Cluster,
) -> None:
    await cluster.start()
    cluster.kube.put({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llama-decode", "namespace": NS, "generation": 1,
                     "labels": labels("llama", "decode")},
        "spec": {"replicas": 0},
    })  # fmt: skip
    await cluster.settle()
    cluster.woken.clear()
    progressing = {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"}
    # Its first sync also records the rollout's revision, through the status subresource.
    stored = cluster.kube.objects["Deployment", NS, "llama-decode"]
    stored["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "1"}
    cluster.kube.set_status("Deployment", NS, "llama-decode", {
        "observedGeneration": 1, "conditions": [progressing],
    })  # fmt: skip
    cluster.kube.set_status("Deployment", NS, "llama-decode", {
        "observedGeneration": 1, "conditions": [{**progressing, "reason": "NewReplicaSetAvailable"}],
    })  # fmt: skip
    await cluster.settle()
    assert cluster.woken == []  # a pool at zero, observed: nothing a pass reports changed
    (cached,) = cluster.cache.children(NS, "llama").values()
    assert cached["status"]["conditions"][0]["reason"] == "NewReplicaSetAvailable"
    failure = {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota"}
    cluster.kube.set_status("Deployment", NS, "llama-decode", {
        "observedGeneration": 1, "conditions": [failure],
    })  # fmt: skip
    cluster.kube.set_status("Deployment", NS, "llama-decode", {
        "observedGeneration": 1, "conditions": [failure], "replicas": 1,
    })  # fmt: skip
    await cluster.settle()
    assert cluster.woken == ["llama", "llama"]


async def test_what_controllers_only_report_on_a_child_wakes_nobody_an_edit_does(
    cluster: Cluster,
) -> None:
    await cluster.start()
    for kind, api in (("PodDisruptionBudget", "policy/v1"),
                      ("HorizontalPodAutoscaler", "autoscaling/v2")):  # fmt: skip
        cluster.kube.put({
            "apiVersion": api, "kind": kind,
            "metadata": {"name": "llama-decode", "namespace": NS, "generation": 1,
                         "labels": labels("llama", "decode")},
            "spec": {"minAvailable": 1} if kind == "PodDisruptionBudget" else {"maxReplicas": 4},
        })  # fmt: skip
    await cluster.settle()
    cluster.woken.clear()
    # The disruption controller's healthy counts and the HPA controller's metrics, as they
    # come every few seconds.
    for healthy in range(3):
        cluster.kube.set_status("PodDisruptionBudget", NS, "llama-decode", {
            "currentHealthy": healthy, "desiredHealthy": 1, "observedGeneration": 1,
        })  # fmt: skip
        cluster.kube.set_status("HorizontalPodAutoscaler", NS, "llama-decode", {
            "currentReplicas": 1, "currentMetrics": [{"type": "Pods", "value": healthy}],
        })  # fmt: skip
    await cluster.settle()
    assert cluster.woken == []
    cached = cluster.cache.children(NS, "llama")
    assert cached["PodDisruptionBudget", "llama-decode"]["status"]["currentHealthy"] == 2
    # Someone edits the PDB's spec: the pass must see it to put it back.
    edited = cluster.kube.objects["PodDisruptionBudget", NS, "llama-decode"]
    cluster.kube.put({**edited, "spec": {"maxUnavailable": 3}})
    await cluster.settle()
    assert cluster.woken == ["llama"]


async def test_an_expired_watch_lists_again_and_drops_what_went_missing(cluster: Cluster) -> None:
    cluster.kube.put(pod("llama-decode-0"))
    cluster.kube.put(pod("llama-decode-1"))
    await cluster.start()
    cluster.woken.clear()
    # Deleted while the watch was down: no event will ever say so.
    del cluster.kube.objects["Pod", NS, "llama-decode-0"]
    cluster.kube.send("Pod", "ERROR", {"code": 410, "reason": "Expired", "message": "too old"})
    await until(lambda: len(cluster.cache.pods(NS, "llama")) == 1)
    assert cluster.woken == ["llama"] and cluster.kube.lists.count("Pod") == 2


async def test_a_kind_whose_api_is_not_installed_has_none_and_does_not_hold_passes_up(
    cluster: Cluster,
) -> None:
    cluster.kube.failures["ScaledObject", "list"] = KubeError(
        404, "NotFound", "the server could not find the requested resource"
    )
    await cluster.start()
    assert cluster.cache.children(NS, "llama") == {}


async def test_a_pass_before_the_first_list_is_refused_with_the_reason(cluster: Cluster) -> None:
    cluster.kube.failures["Deployment", "list"] = KubeError(
        403, "Forbidden", 'deployments.apps is forbidden: User "operator" cannot list'
    )
    cluster.task = asyncio.create_task(cluster.cache.run())
    await until(lambda: "Deployment" not in cluster.kube.lists and _refusal(cluster) is not None)
    refusal = _refusal(cluster)
    assert refusal is not None and "Deployments in team not listed yet" in refusal
    assert "cannot list" in refusal


class Persistent(dict[tuple[str, str], KubeError]):
    """Injected failures that stay: every attempt fails, not only the first."""

    def pop(self, key: tuple[str, str], default: Any = None) -> Any:
        return self.get(key, default)


async def test_forbidden_pods_hold_no_pass_back(cluster: Cluster) -> None:
    cluster.kube.failures = Persistent(
        {("Pod", "list"): KubeError(403, "Forbidden", 'pods is forbidden: User "op" cannot list')}
    )
    await asyncio.wait_for(cluster.start(), 5)  # synced although pods were never listed
    assert cluster.cache.children(NS, "llama") == {}
    assert cluster.cache.pods(NS, "llama") == []


async def test_a_pass_over_an_unchanged_model_lists_nothing() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    # The Deployment controller observing the three new Deployments woke the model, and the
    # echoes of the pass's own applies and status write woke nothing.
    assert world.woken == [(NS, NAME)] * 3
    world.woken.clear()
    listed = len(world.kube.lists)
    writes = len(world.kube.writes)
    await world.reconcile()
    await world.reconcile()
    assert len(world.kube.lists) == listed and len(world.kube.writes) == writes
    assert world.woken == []


async def test_a_child_deleted_by_hand_wakes_its_model_and_comes_back() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    world.woken.clear()
    await world.kube.delete("Service", NS, f"{NAME}-decode")
    await world.settle()
    assert world.woken == [(NS, NAME)]
    outcome = await world.reconcile()
    assert outcome.applied == 1 and world.kube.stored("Service", NS, f"{NAME}-decode")


class EchoFirst(FakeKube):
    """An API server whose watches deliver a write's event before it answers the write, and
    a controller that may act on a Deployment in between (as the Deployment controller does
    when it sees a new generation)."""

    def __init__(self) -> None:
        super().__init__()
        self.deployment_controller = False  # it acts only where this test says
        self.controller_reports: Obj | None = None
        """The status the controller sets on a Deployment just applied, if it acts."""

    async def apply(self, obj: Obj, *, force: bool = True, manager: str = MANAGER) -> Obj:
        answer = await super().apply(obj, force=force, manager=manager)
        await self.delivered()
        if self.controller_reports is not None and obj["kind"] == "Deployment":
            meta = obj["metadata"]
            self.set_status("Deployment", meta["namespace"], meta["name"], self.controller_reports)
            await self.delivered()
        return answer


async def test_the_echo_of_a_write_wakes_nobody_but_a_change_after_it_does() -> None:
    world = World(load_example("minimal"), kube=EchoFirst())
    await world.reconcile()
    await world.settle()
    assert world.woken == []  # every child's event arrived while its apply was under way
    assert isinstance(world.kube, EchoFirst)
    # The controller starts rolling out what the apply changed: news the pass did not read.
    world.kube.controller_reports = {"replicas": 2, "updatedReplicas": 1}
    world.edit({"decode": {"replicas": 2}})
    await world.settle()
    assert world.woken == [(NS, NAME)]  # the user's edit
    world.woken.clear()
    await world.reconcile()
    await world.settle()
    assert world.woken == [(NS, NAME)]  # the controller's status came after the apply


async def test_a_controller_only_reporting_on_a_child_being_written_wakes_nobody() -> None:
    world = World(load_example("minimal"), kube=EchoFirst())
    await world.reconcile()
    await world.settle()
    assert isinstance(world.kube, EchoFirst)
    # Between the apply and its answer the controller records only its bookkeeping (a
    # condition a pass does not read), as the Deployment controller does on a new one.
    world.kube.controller_reports = {
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"}]
    }
    world.edit({"decode": {"maxNumSeqs": 64}})
    await world.settle()
    world.woken.clear()
    await world.reconcile()
    await world.settle()
    assert world.woken == []


class StatusEchoFirst(FakeKube):
    """An API server whose model watch delivers a status write's event before it answers
    the write, with, if a test says so, a user's edit landing in between."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], None] | None = None

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Obj, resource_version: str | None = None
    ) -> Obj:
        answer = await super().patch_status(kind, namespace, name, status, resource_version)
        await self.delivered()
        if self.meanwhile is not None:
            self.meanwhile()
            await self.delivered()
        return answer


async def test_the_echo_of_a_status_write_wakes_nobody_but_an_edit_during_it_does() -> None:
    world = World(idle_model(), kube=StatusEchoFirst())
    await world.settle()
    world.woken.clear()  # the model's creation
    await world.reconcile()
    await world.settle()
    assert world.model()["status"]["observedGeneration"] == 1
    assert world.woken == []  # the status write's echo arrived before its answer
    assert isinstance(world.kube, StatusEchoFirst)
    world.kube.meanwhile = lambda: world.edit({"decode": {"maxNumSeqs": 64}})
    world.edit({"decode": {"maxNumSeqs": 32}})
    await world.settle()
    world.woken.clear()
    await world.reconcile()
    world.kube.meanwhile = None
    await world.settle()
    assert world.woken == [(NS, NAME)]  # the edit that landed during the status write
    world.woken.clear()
    await world.reconcile()
    await world.settle()
    assert world.model()["status"]["observedGeneration"] == 3
    assert world.woken == []


async def test_a_pass_reads_its_model_as_the_watch_delivered_it() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()  # the model's first read: the watch had delivered nothing yet
    world.edit({"decode": {"replicas": 2}})
    await world.reconcile()
    await world.reconcile()
    assert world.kube.gets == ["DisaggregatedModel"]
    assert world.deployment("decode")["spec"]["replicas"] == 2


async def test_a_model_kept_too_old_is_read_afresh_after_its_status_write_is_refused() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    stale = world.model()
    world.edit({"decode": {"replicas": 2}})
    await world.settle()
    world.models.record({**stale, "metadata": {**stale["metadata"], "resourceVersion": "999999"}})
    outcome = await world.reconcile()  # a version the server no longer holds
    assert outcome.conflict
    await world.reconcile()
    assert world.kube.gets == ["DisaggregatedModel"] * 2
    assert world.model()["status"]["observedGeneration"] == 2


def _refusal(cluster: Cluster) -> str | None:
    try:
        cluster.cache.children(NS, "llama")
    except NotSynced as error:
        return error.message if "Deployment" in error.message else None
    return None
