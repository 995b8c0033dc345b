"""In-process simulated vLLM engines on their own HTTP ports, for router tests."""

from __future__ import annotations

from aiohttp import web

from disagg.perf import NETWORKS, EngineShape, gpu_profile, kv_capacity_tokens, model_profile
from disagg.sim.engine import Engine, EngineConfig
from disagg.sim.server import build_app as build_engine_app


def engine(role: str, prefix_caching: bool = True) -> Engine:
    """Llama-3.1-8B on one H100, twenty times faster than real time."""
    shape = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"), 1)
    return Engine(
        EngineConfig(
            served_model_name="m", role=role, shape=shape,  # type: ignore[arg-type]
            max_num_batched_tokens=8192, max_num_seqs=16,
            kv_capacity_tokens=kv_capacity_tokens(shape), time_scale=0.05,
            network=NETWORKS["ib400"], prefix_caching=prefix_caching,
        )
    )  # fmt: skip


async def serve_engine(role: str) -> tuple[Engine, web.AppRunner, str]:
    """A started engine, its app runner (to clean up) and its base URL."""
    served = engine(role)
    runner = web.AppRunner(build_engine_app(served))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    await served.start("127.0.0.1")
    return served, runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
