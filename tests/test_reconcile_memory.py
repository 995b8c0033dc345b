"""The autoscaler's memory across operator restarts, through the reconcile pass: kept in the
model's status, read back by the next operator (or leader), never trusted blindly."""

from __future__ import annotations

import copy
import json

from disagg.api.resource import known_fields
from disagg.api.schema import model_schema
from disagg.api.status import DisaggregatedModelStatus
from disagg.autoscale.policy import Signals
from disagg.autoscale.recall import MEMORY_REFRESH_SECONDS
from disagg.kube.events import EventRecorder
from disagg.naming import RELEARN_ANNOTATION
from disagg.reconcile.model import Reconciler
from test_reconcile_pass import NAME, NS, World, autoscaled


def restart(world: World) -> None:
    """A new operator process: the same API server and watches, nothing in memory."""
    world.reconciler = Reconciler(
        world.kube,  # type: ignore[arg-type]
        EventRecorder(world.kube, clock=world.clock),  # type: ignore[arg-type]
        world.cache,
        world.models,
        clock=world.clock,
        prometheus=lambda url: world.prometheus,
    )


async def serving(world: World, evaluations: int) -> None:
    """Pools up, then ``evaluations`` evaluations 15 s apart of a prefill pool whose load
    varies (its metrics change, so each evaluation writes status)."""
    await world.reconcile()
    world.pools_ready()
    for k in range(evaluations):
        world.prometheus.prefill = Signals(p99=0.4 + k / 100, request_rate=6.0, queue=2.0,
                                           running=3.0, pods_reporting=1)  # fmt: skip
        world.clock.now += 15
        await world.reconcile()
        world.pools_ready()


async def test_a_restarted_operator_goes_on_with_what_the_last_one_remembered() -> None:
    world = World(autoscaled())
    await serving(world, 6)
    before = world.reconciler.scalers[NS, NAME].memories
    memory = world.model()["status"]["autoscalerMemory"]
    assert memory["mode"] == "disaggregated"
    assert len(json.loads(memory["prefill"]["history"])["recommendations"]) == 6

    restart(world)
    world.clock.now += 15
    await world.reconcile()
    after = world.reconciler.scalers[NS, NAME].memories
    for pool in ("prefill", "decode"):
        # Every recommendation the last operator made, then this one's first.
        assert after[pool].recommendations[:-1] == before[pool].recommendations
        assert after[pool].arrivals[:-1] == before[pool].arrivals
        assert after[pool].shape == before[pool].shape is not None
    assert not world.events("AutoscalerMemoryUnreadable")
    assert not world.events("LearningAgain")  # the same engines: their speed stands


async def test_a_memory_that_cannot_be_read_is_named_learned_again_and_costs_nothing_else() -> None:
    world = World(autoscaled())
    await serving(world, 3)
    ready_since = world.condition("Ready")["lastTransitionTime"]
    status = world.model()["status"]
    status["autoscalerMemory"]["decode"]["history"] = '{"arrivals": [[0, "many"]]}'
    world.kube.set_status("DisaggregatedModel", NS, NAME, status)

    restart(world)
    world.clock.now += 15
    await world.reconcile()
    warned = world.events("AutoscalerMemoryUnreadable")
    assert len(warned) == 1
    assert warned[0]["message"] == (
        "learning again: status.autoscalerMemory.decode.history.arrivals[0]: 'many' is not a "
        "finite number"
    )
    assert world.condition("Ready")["lastTransitionTime"] == ready_since
    # The unreadable history is replaced at once, not when the memory is next refreshed.
    decode = json.loads(world.model()["status"]["autoscalerMemory"]["decode"]["history"])
    assert [rate for _, rate in decode["arrivals"]] == [1.0]
    assert (
        json.loads(world.model()["status"]["autoscalerMemory"]["prefill"]["history"])[
            "recommendations"
        ][0][0]
        < -15
    )  # the prefill pool's history was kept: it reaches back before the restart


async def test_an_idle_models_history_is_written_once_per_refresh_not_per_evaluation() -> None:
    world = World(autoscaled())
    await world.reconcile()
    world.pools_ready()
    world.prometheus.prefill = Signals(p99=None, request_rate=0.0, queue=0.0, running=0.0,
                                       pods_reporting=1)  # fmt: skip
    world.prometheus.decode = Signals(p99=None, request_rate=0.0, queue=0.0, running=0.0,
                                      kv_usage=0.0, pods_reporting=1)  # fmt: skip
    for _ in range(3):
        world.clock.now += 15
        await world.reconcile()
    writes = len(world.kube.writes_of("DisaggregatedModel"))
    evaluations = int(MEMORY_REFRESH_SECONDS // 15)
    for _ in range(evaluations):
        world.clock.now += 15
        await world.reconcile()
    assert len(world.kube.writes_of("DisaggregatedModel")) - writes == 1


async def test_turning_the_autoscaler_off_removes_its_memory_from_status() -> None:
    world = World(autoscaled())
    await serving(world, 2)
    assert "autoscalerMemory" in world.model()["status"]
    world.edit({"autoscaling": {"enabled": False}})
    await world.reconcile()
    assert "autoscalerMemory" not in world.model()["status"]


async def test_a_mode_switch_learns_again_and_the_new_pools_memory_survives_a_restart() -> None:
    """What disaggregated pools taught does not hold for a colocated engine pool."""
    world = World(autoscaled())
    await serving(world, 3)
    world.edit({"mode": "colocated"})
    await world.reconcile()
    assert "autoscalerMemory" not in world.model()["status"]
    world.pools_ready("engine")
    for k in range(3):
        world.prometheus.prefill = Signals(p99=0.3 + k / 100, request_rate=6.0, queue=0.0,
                                           running=3.0, pods_reporting=1)  # fmt: skip
        world.clock.now += 15
        await world.reconcile()
        world.pools_ready("engine", "router")
    memory = world.model()["status"]["autoscalerMemory"]
    assert memory["mode"] == "colocated"
    before = world.reconciler.scalers[NS, NAME].memories["prefill"].recommendations

    restart(world)
    world.clock.now += 15
    await world.reconcile()
    assert world.reconciler.scalers[NS, NAME].memories["prefill"].recommendations[:-1] == before
    assert not world.events("AutoscalerMemoryUnreadable")


async def test_a_pool_whose_engines_changed_learns_their_speed_again_and_keeps_its_traffic() -> (
    None
):
    world = World(autoscaled())
    await serving(world, 3)
    memories = world.reconciler.scalers[NS, NAME].memories
    memories["prefill"].prefill_speed = memories["decode"].batch = 12000.0
    memories["prefill"].down_window = 900.0
    seen = list(memories["prefill"].recommendations)

    world.edit({"prefill": {"autoscaling": {"maxReplicas": 6}}})  # how many, not how fast
    world.clock.now += 15
    await world.reconcile()
    assert memories["prefill"].prefill_speed == 12000.0 and not world.events("LearningAgain")

    world.edit({"prefill": {"tensorParallelSize": 2}})
    world.clock.now += 15
    await world.reconcile()
    assert memories["prefill"].prefill_speed is None  # learned again on TP2
    assert memories["prefill"].down_window == 900.0  # what the traffic taught stays
    assert memories["prefill"].recommendations[: len(seen)] == seen
    assert memories["decode"].batch == 12000.0  # the decode pool did not change
    (event,) = world.events("LearningAgain")
    assert event["message"].startswith("prefill: what sets how fast the engines are changed")
    world.clock.now += 15
    await world.reconcile()
    assert len(world.events("LearningAgain")) == 1


async def test_the_relearn_annotation_asks_both_pools_to_learn_their_speed_again() -> None:
    """What the spec does not show (a moved image tag, new GPUs behind the same node
    selector) is said with an annotation: each change of it forgets what was learned of the
    engines, once, and keeps what the traffic taught."""
    world = World(autoscaled())
    await serving(world, 3)
    memories = world.reconciler.scalers[NS, NAME].memories
    memories["prefill"].prefill_speed = memories["decode"].batch = 12000.0
    memories["prefill"].down_window = 900.0

    def annotate(value: str | None) -> None:
        obj = world.model()
        annotations = obj["metadata"].setdefault("annotations", {})
        if value is None:
            annotations.pop(RELEARN_ANNOTATION)
        else:
            annotations[RELEARN_ANNOTATION] = value
        world.kube.put(obj)

    templates = {
        r: copy.deepcopy(world.deployment(r)["spec"]["template"]) for r in ("prefill", "decode")
    }
    annotate("driver-550")
    world.clock.now += 15
    await world.reconcile()
    assert memories["prefill"].prefill_speed is None and memories["decode"].batch is None
    assert memories["prefill"].down_window == 900.0
    (event,) = world.events("LearningAgain")
    assert event["message"].startswith("prefill and decode: what sets how fast")
    assert RELEARN_ANNOTATION in event["message"]
    for role in ("prefill", "decode"):  # no pod restarts for it
        assert world.deployment(role)["spec"]["template"] == templates[role]

    memories["prefill"].prefill_speed = 9000.0
    world.clock.now += 15
    await world.reconcile()  # the same value: nothing more to learn again
    assert memories["prefill"].prefill_speed == 9000.0 and len(world.events("LearningAgain")) == 1
    # Said at once even while Prometheus is out of reach, and kept in status: a restart
    # before the metrics come back does not learn again a second time.
    world.prometheus.down = True
    annotate(None)
    world.clock.now += 15
    await world.reconcile()
    assert memories["prefill"].prefill_speed is None
    assert len(world.events("LearningAgain")) == 2
    assert len(world.events("MetricsUnavailable")) == 1
    restart(world)
    world.clock.now += 15
    await world.reconcile()
    assert len(world.events("LearningAgain")) == 2


async def test_the_status_this_version_writes_is_kept_whole_when_unknown_fields_are_left_out() -> (
    None
):
    """What previous_status prunes is only what the CRD's schema does not describe."""
    world = World(autoscaled())
    await serving(world, 3)
    status = world.model()["status"]
    assert {"conditions", "metrics", "autoscalerMemory"} <= status.keys()
    assert known_fields(status, model_schema(DisaggregatedModelStatus)) == status


async def test_a_status_another_operator_version_wrote_leaves_the_model_reconciled() -> None:
    """A rollback: the newer operator wrote status fields this one does not know. Status is
    the operator's, not the user's: the model is not InvalidSpec, its conditions keep their
    times, and only the memory holding an unknown field is learned again, by name."""
    world = World(autoscaled())
    await serving(world, 3)
    ready_since = world.condition("Ready")["lastTransitionTime"]
    status = world.model()["status"]
    status["rolloutHistory"] = [{"revision": 2}]
    for condition in status["conditions"]:
        condition["severity"] = "Info"
    status["autoscalerMemory"]["prefill"]["learned"]["warmupSeconds"] = 30.0
    world.kube.set_status("DisaggregatedModel", NS, NAME, status)

    restart(world)
    world.clock.now += 15
    outcome = await world.reconcile()
    assert not outcome.invalid and not world.events("InvalidSpec")
    assert world.condition("Degraded")["status"] == "False"
    assert world.condition("Ready")["lastTransitionTime"] == ready_since
    assert [event["message"] for event in world.events("AutoscalerMemoryUnreadable")] == [
        "learning again: status.autoscalerMemory.prefill.learned.warmupSeconds: unknown field"
    ]
    # Still autoscaled: the next evaluation saved a memory this version can read.
    restart(world)
    world.clock.now += 15
    await world.reconcile()
    assert len(world.events("AutoscalerMemoryUnreadable")) == 1
