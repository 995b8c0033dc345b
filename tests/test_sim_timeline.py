"""The engine simulator reports what its model says, not how busy the host is.

On a loaded host the engine loop wakes late; a real GPU does not wait for a CPU, so the
latencies the simulator reports (and the autoscaler reads) must not grow with the host's
lag, and the lag itself must be visible.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from disagg.perf import NETWORKS, EngineShape, gpu_profile, kv_capacity_tokens, model_profile
from disagg.sim.engine import MAX_CATCH_UP, Engine, EngineConfig, Timeline
from disagg.sim.scheduler import SimRequest

TIME_SCALE = 0.5


def test_a_busy_timeline_chains_steps_end_to_start() -> None:
    timeline = Timeline()
    timeline.notify(10.0)
    assert timeline.start(now=10.02) == 10.0  # woken 20 ms late: starts on time
    timeline.finish(10.1, work_left=True)
    assert timeline.start(now=10.18) == 10.1


def test_an_idle_engine_starts_when_work_arrives() -> None:
    timeline = Timeline()
    timeline.finish(5.0, work_left=False)
    timeline.notify(7.0)
    assert timeline.start(now=7.03) == 7.0


def test_a_host_far_behind_moves_the_timeline_to_the_present() -> None:
    timeline = Timeline()
    timeline.finish(1.0, work_left=True)
    late = 1.0 + MAX_CATCH_UP + 0.1
    assert timeline.start(now=late) == late


def _engine() -> Engine:
    shape = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"), 1)
    config = EngineConfig(
        served_model_name="m",
        role="decode",
        shape=shape,
        max_num_batched_tokens=8192,
        max_num_seqs=64,
        kv_capacity_tokens=kv_capacity_tokens(shape),
        time_scale=TIME_SCALE,
        network=NETWORKS["ib400"],
    )
    return Engine(config)


def _histogram(engine: Engine, name: str) -> dict[float, float]:
    text = generate_latest(engine.metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {
                float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")
            }
    raise AssertionError(f"{name} not exported")


async def _decode(engine: Engine, tokens: int, hog: bool, company: int = 0) -> list[float]:
    """Stream one request's tokens, with ``company`` short requests arriving 20 ms apart
    while it decodes; with ``hog``, block the event loop 30 ms at a time as a busy host
    would, between the engine's steps."""
    await engine.start("127.0.0.1")
    stop = asyncio.Event()

    async def hog_loop() -> None:
        while not stop.is_set():
            time.sleep(0.03)  # noqa: ASYNC251 - the point: the loop is held as a busy host holds it
            await asyncio.sleep(0.005)

    async def companion(index: int) -> None:
        await asyncio.sleep(0.02 * (index + 1))
        short = SimRequest(id=f"c{index}", prompt_tokens=64, max_tokens=4, kv_ready=True)
        async for _ in engine.run(short, time.monotonic()):
            pass

    hogger = asyncio.create_task(hog_loop()) if hog else None
    companions = [asyncio.create_task(companion(i)) for i in range(company)]
    request = SimRequest(id="r", prompt_tokens=64, max_tokens=tokens, kv_ready=True)
    try:
        return [t async for t in engine.run(request, time.monotonic())]
    finally:
        await asyncio.gather(*companions)
        stop.set()
        if hogger is not None:
            await hogger
        await engine.close()


def test_inter_token_latency_does_not_depend_on_host_lag() -> None:
    quiet_engine, busy_engine = _engine(), _engine()
    quiet = asyncio.run(_decode(quiet_engine, 40, hog=False))
    busy = asyncio.run(_decode(busy_engine, 40, hog=True))
    quiet_gaps = [b - a for a, b in itertools.pairwise(quiet)]
    busy_gaps = [b - a for a, b in itertools.pairwise(busy)]
    # The host delayed the busy engine's wake-ups by tens of milliseconds, many times...
    lag = _histogram(busy_engine, "disagg_sim_host_lag_seconds")
    assert lag[math.inf] - lag[0.01] >= 10, lag
    # ...yet each token gap it records is the modelled step, as on the quiet engine.
    assert max(busy_gaps) < 1.2 * max(quiet_gaps), (max(quiet_gaps), max(busy_gaps))
    assert _histogram(busy_engine, "vllm:inter_token_latency_seconds") == _histogram(
        quiet_engine, "vllm:inter_token_latency_seconds"
    )


def test_requests_arriving_on_a_late_host_do_not_stretch_a_running_decode() -> None:
    """A newcomer the late-woken loop finds waiting joins the first step that starts after
    it was queued; the step already due for the running request is not held back for it."""
    quiet_engine, busy_engine = _engine(), _engine()
    quiet = asyncio.run(_decode(quiet_engine, 80, hog=False, company=8))
    busy = asyncio.run(_decode(busy_engine, 80, hog=True, company=8))
    quiet_gaps = [b - a for a, b in itertools.pairwise(quiet)]
    busy_gaps = [b - a for a, b in itertools.pairwise(busy)]
    assert max(busy_gaps) < 1.2 * max(quiet_gaps), (max(quiet_gaps), max(busy_gaps))
    served = _histogram(busy_engine, "vllm:e2e_request_latency_seconds")
    assert served[math.inf] == 9, served  # the companions were served, not dropped
