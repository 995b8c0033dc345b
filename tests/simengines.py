"""In-process simulated vLLM engines on their own HTTP ports, for router tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from disagg.perf import NETWORKS, EngineShape, gpu_profile, kv_capacity_tokens, model_profile
from disagg.router.app import build_app
from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.metrics import RouterMetrics
from disagg.router.state import Router, RouterConfig
from disagg.sim.engine import Engine, EngineConfig
from disagg.sim.server import build_app as build_engine_app

Stack = tuple[TestClient[web.Request, web.Application], Router, dict[str, Engine]]
"""A router's test client, the router, and its simulated engines by URL."""


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


@asynccontextmanager
async def router_stack(roles: Sequence[str], config: RouterConfig) -> AsyncIterator[Stack]:
    """A router (least-outstanding) in front of simulated engines of these roles, in order."""
    served = [await serve_engine(role) for role in roles]
    prefill, decode = Pool("prefill"), Pool("decode")
    urls = {role: [url for (_, _, url), r in zip(served, roles, strict=True) if r == role]
            for role in ("prefill", "decode")}  # fmt: skip
    prefill.replace([Endpoint(url) for url in urls["prefill"]])
    decode.replace([Endpoint(url) for url in urls["decode"]])
    router = Router(config, prefill, decode, Picker("least-outstanding"), RouterMetrics())
    client = TestClient(TestServer(build_app(router)))
    await client.start_server()
    try:
        yield client, router, {url: engine for engine, _, url in served}
    finally:
        await client.close()
        for engine, runner, _ in served:
            await engine.close()
            await runner.cleanup()


def prompt_tokens(engine: Engine) -> float:
    """The prompt tokens an engine computed (its vllm:prompt_tokens_total)."""
    value = engine.metrics.registry.get_sample_value(
        "vllm:prompt_tokens_total", engine.metrics.labels
    )
    return value or 0.0
