"""The engine pod's preStop hook (`disagg-engine drain`) against a real simulated engine,
and the pod emulator running it as the kubelet would."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml
from aiohttp import web

from disagg.devcluster.podemu import pre_stop_argv
from disagg.perf import NETWORKS, EngineShape, gpu_profile, kv_capacity_tokens, model_profile
from disagg.sim.engine import Engine, EngineConfig
from disagg.sim.scheduler import SimRequest
from disagg.sim.server import build_app
from disagg_engine.drain import drain

GOLDEN = Path(__file__).parent / "golden" / "tcp-dev.yaml"


def _engine() -> Engine:
    shape = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"), 1)
    return Engine(
        EngineConfig(
            served_model_name="m", role="decode", shape=shape, max_num_batched_tokens=8192,
            max_num_seqs=8, kv_capacity_tokens=kv_capacity_tokens(shape), time_scale=1.0,
            network=NETWORKS["ib400"],
        )
    )  # fmt: skip


async def _drain_during_a_request() -> tuple[float, float, bool, str]:
    engine = _engine()
    runner = web.AppRunner(build_app(engine))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    await engine.start("127.0.0.1")
    try:
        # ~150 decode steps of a few ms each: the request runs for a good part of a second.
        generation = asyncio.create_task(
            _collect(engine, SimRequest(id="s", prompt_tokens=64, max_tokens=150, kv_ready=True))
        )
        await asyncio.sleep(0.05)
        drained, what = await asyncio.to_thread(drain, port, 30.0, "decode", 0.0, "127.0.0.1")
        returned = time.monotonic()
        finished = await generation
        return finished, returned, drained, what
    finally:
        await engine.close()
        await runner.cleanup()


async def _collect(engine: Engine, request: SimRequest) -> float:
    async for _ in engine.run(request, time.monotonic()):
        pass
    return time.monotonic()


def test_drain_waits_for_the_running_request_to_finish() -> None:
    finished, returned, drained, what = asyncio.run(_drain_during_a_request())
    assert drained and what == "drained"
    assert returned >= finished, (returned, finished)


def test_drain_of_an_engine_that_is_gone_returns_at_once() -> None:
    started = time.monotonic()
    drained, what = drain(1, 30.0, "prefill", 30.0, "127.0.0.1")
    assert drained and "not answering" in what
    assert time.monotonic() - started < 5


def test_the_pod_emulator_runs_the_rendered_pre_stop_hook_at_the_pod_ip() -> None:
    deployment = next(
        d
        for d in yaml.safe_load_all(GOLDEN.read_text())
        if d["kind"] == "Deployment" and d["metadata"]["labels"].get("disagg.dev/role") == "decode"
    )
    pod = {"spec": deployment["spec"]["template"]["spec"], "status": {"podIP": "127.9.0.7"}}
    hook = pre_stop_argv(pod)
    assert hook is not None
    argv, env = hook
    assert argv[1:] == [
        "-m", "disagg_engine.cli", "drain", "--port", "8000", "--timeout", "110",
        "--host", "127.9.0.7",
    ]  # fmt: skip
    assert env["DISAGG_ROLE"] == "decode"
    assert (
        pre_stop_argv({"spec": {"containers": [{"name": "x"}]}, "status": {"podIP": "1"}}) is None
    )
