"""The autoscaler's memory kept in status: read back after a restart it decides as before;
what cannot be read is named and learned again, never trusted."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

import pytest

from disagg.api.status import MEMORY_HISTORY_MAX_LENGTH
from disagg.autoscale.memory import PoolMemory
from disagg.autoscale.model import PoolName
from disagg.autoscale.policy import Behavior, PoolPolicy, Signals, decide_pool
from disagg.autoscale.recall import (
    LEARNED,
    MEMORY_REFRESH_SECONDS,
    NUMBERS,
    SERIES,
    TIMES,
    recalled,
    remembered,
    worth_saving,
)

NOW = 1_800_000_000.0
POOLS: tuple[PoolName, ...] = ("prefill", "decode")


def served() -> PoolMemory:
    """A pool's memory after an hour of traffic with a burst (a learned look-back)."""
    memory = PoolMemory(prefill_speed=11433.25, batched_speed=12890.5, batched_prompt=1138.0,
                        provisioning=122.5, down_window=900.0, learned_at=NOW - 400.0,
                        last_up=NOW - 400.0, last_down=NOW - 2000.0, ready_at=NOW - 280.0,
                        ready_count=4, wanted_count=4, queue_change=-0.2, window_queue_change=0.05,
                        window_held_change=-0.125)  # fmt: skip
    for k in range(40):
        t = NOW - 600.0 + 15 * k
        memory.recommendations.append((t, 4 if k < 20 else 2, 4 if k < 20 else 2))
        memory.demand.append((t, 9000.0 + k / 3))
        memory.arrivals.append((t, 7.0 + k % 2 / 7))
    memory.queues = [(NOW - 15.0, 3.0, None), (NOW, 0.0, 12.0)]
    return memory


def through_status(memory: PoolMemory, now: float = NOW) -> Any:
    """The memory as the API server hands it back: the status object as JSON."""
    saved = remembered({"prefill": memory, "decode": PoolMemory()}, "disaggregated", NOW)
    return json.loads(json.dumps(saved.to_wire()))


def test_every_field_of_the_memory_is_kept() -> None:
    """A field added to PoolMemory and not to what status keeps would be lost at restarts."""
    kept = {*SERIES, *TIMES, *NUMBERS, *LEARNED, "ready_count", "wanted_count", "shape"}
    assert {f.name for f in fields(PoolMemory)} == kept


def test_a_memory_read_back_from_status_is_the_one_saved() -> None:
    memory = served()
    memory.batch, memory.idle_since, memory.starting_since = 64.5, NOW - 45.5, NOW - 30.25
    memory.orders = [(NOW - 30.25, 2), (NOW - 15.0, 1)]
    memory.lifetimes = [(NOW - 15.0, 30.0, 8.9), (NOW, 31.5, 9.125)]
    memory.steps = [(NOW - 900.0, 20.0, 0.025), (NOW, 42.5, 0.0315)]
    memory.outputs = [(NOW, 180.25)]
    memory.shape = "0123456789abcdef"
    recall = recalled(through_status(memory), "disaggregated", POOLS, NOW + 30)
    assert recall.problems == []
    assert asdict(recall.memories["prefill"]) == asdict(memory)
    assert asdict(recall.memories["decode"]) == asdict(PoolMemory())
    assert recall.kept is not None and recall.kept.prefill is not None
    # What was learned reads in status as such, not only inside the history.
    learned = recall.kept.prefill.learned
    assert learned.prefill_tokens_per_second == 11433.25 and learned.look_back_seconds == 900


def test_a_restarted_autoscaler_keeps_the_look_back_a_burst_taught() -> None:
    """Four replicas recommended until five minutes ago, two since: the learned 900 s
    look-back holds four; an empty memory (the restart before status kept it) holds them
    only until it has seen the spec's 300 s, then lets one go while the burst may come
    back."""
    policy = PoolPolicy(slo=2.0, min_replicas=1, max_replicas=8, gpus_per_replica=1)
    quiet = Signals(p99=0.4, request_rate=7.0, queue=0.0, running=2.0, pods_reporting=4,
                    sampled_at=NOW)  # fmt: skip
    restored = recalled(through_status(served()), "disaggregated", POOLS, NOW).memories["prefill"]
    fresh = PoolMemory()
    for k in range(1, 22):
        now = NOW + 15 * k
        signals = Signals(**{**quiet.__dict__, "sampled_at": now})
        kept = decide_pool("prefill", signals, 4, 4, policy, Behavior(), restored, None, now)
        lost = decide_pool("prefill", signals, 4, 4, policy, Behavior(), fresh, None, now)
    assert kept.desired == 4, kept.reason
    assert "learned 900s" in kept.reason
    assert lost.desired < 4, lost.reason


def test_samples_from_after_now_are_dropped() -> None:
    """The old operator's node clock ran a minute ahead of this one's."""
    recall = recalled(through_status(served()), "disaggregated", POOLS, NOW - 60)
    memory = recall.memories["prefill"]
    assert recall.problems == []
    assert max(t for t, _ in memory.arrivals) <= NOW - 60
    assert len(memory.arrivals) == 37  # of 40, every 15 s up to 15 s before NOW
    assert memory.ready_at == NOW - 280.0 and memory.queues == []


def _edited(change: dict[str, Any]) -> Any:
    wire = through_status(served())
    history = json.loads(wire["prefill"]["history"])
    history.update(change)
    wire["prefill"]["history"] = json.dumps(history)
    return wire


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"arrivals": [[0, "fast"]]}, "prefill.history.arrivals[0]: 'fast' is not a finite number"),
        ({"recommendations": [[0, 2.5, 2]]}, "prefill.history.recommendations[0]: 2.5 is not a replica count"),
        ({"demand": [[0, 1, 2]]}, "prefill.history.demand[0]: expected 2 values, got [0, 1, 2]"),
        ({"queues": {"0": 1}}, "prefill.history.queues: expected a list"),
        ({"lastUp": 3}, "prefill.history: unknown field(s) lastUp"),
        ({"ready_count": -1}, "prefill.history.ready_count[0]: -1 is not a replica count"),
    ],
)  # fmt: skip
def test_a_history_that_does_not_read_is_named_and_that_pool_learns_again(
    change: dict[str, Any], named: str
) -> None:
    saved = _edited(change)
    saved["decode"] = through_status(served())["prefill"]
    recall = recalled(saved, "disaggregated", POOLS, NOW)
    assert recall.problems == [f"status.autoscalerMemory.{named}"]
    assert asdict(recall.memories["prefill"]) == asdict(PoolMemory())
    assert asdict(recall.memories["decode"]) == asdict(served())  # the other pool is kept
    assert recall.kept is None  # status gets a fresh memory at the next evaluation


def test_a_memory_that_does_not_validate_is_named_by_field() -> None:
    saved = through_status(served())
    saved["prefill"]["learned"]["prefillTokensPerSecond"] = -5
    saved["decode"]["history"] = "{not json"
    recall = recalled(saved, "disaggregated", POOLS, NOW)
    assert recall.problems == [
        "status.autoscalerMemory.prefill.learned.prefillTokensPerSecond: "
        "Input should be greater than 0 (got -5)"
    ]
    saved["prefill"]["learned"]["prefillTokensPerSecond"] = 5000
    recall = recalled(saved, "disaggregated", POOLS, NOW)
    assert recall.problems == [
        "status.autoscalerMemory.decode.history: not JSON (Expecting property name enclosed "
        "in double quotes at character 1)"
    ]
    assert recall.memories["prefill"].prefill_speed == 5000


def test_another_modes_memory_is_not_restored() -> None:
    """What a colocated engine pool taught does not hold for disaggregated pools."""
    saved = through_status(served())
    saved["mode"] = "colocated"
    recall = recalled(saved, "disaggregated", POOLS, NOW)
    assert recall.problems == [] and recall.kept is None
    assert asdict(recall.memories["prefill"]) == asdict(PoolMemory())


def test_recent_history_alone_waits_for_other_news_or_for_its_age() -> None:
    history_only = {"savedAt": "t", "prefill": {"history": "{}"}, "decode": {"history": "{}"}}
    assert not worth_saving(history_only, 15.0)
    assert worth_saving(history_only, MEMORY_REFRESH_SECONDS)
    assert worth_saving({"savedAt": "t", "prefill": {"learned": {"lookBackSeconds": 900}}}, 15.0)
    assert worth_saving({"mode": "colocated", "savedAt": "t"}, 15.0)
    assert worth_saving(None, 15.0)  # status held one, and the autoscaler was turned off


def test_a_history_longer_than_status_holds_keeps_its_newest_samples() -> None:
    """An interval of a second under a long look-back: far more samples than status holds."""
    memory = served()
    memory.recommendations = [(NOW - 30000.0 + k, 3, 3) for k in range(30000)]
    saved = remembered({"prefill": memory}, "disaggregated", NOW)
    assert saved.prefill is not None
    assert len(saved.prefill.history) <= MEMORY_HISTORY_MAX_LENGTH
    restored = recalled(saved.to_wire(), "disaggregated", ("prefill",), NOW).memories["prefill"]
    assert restored.recommendations[-1] == memory.recommendations[-1]
    assert 1000 < len(restored.recommendations) < 30000


def test_a_new_engine_shape_forgets_the_speed_but_not_the_traffic() -> None:
    memory = served()
    assert not memory.reshape("aaaa")  # the first shape seen: nothing to forget
    assert memory.prefill_speed == 11433.25
    assert memory.reshape("bbbb")
    assert memory.prefill_speed is None and memory.batched_speed is None
    assert memory.down_window == 900.0 and len(memory.recommendations) == 40
