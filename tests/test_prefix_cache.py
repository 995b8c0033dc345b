"""The engine simulator's prefix cache: chained block hashes, reuse, LRU eviction, and the
prefill compute and vLLM counters it changes."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import generate_latest

from disagg.perf import NETWORKS, EngineShape, gpu_profile, kv_capacity_tokens, model_profile
from disagg.routing.tokens import estimate_tokens
from disagg.sim.engine import Engine, EngineConfig
from disagg.sim.prefix_cache import PrefixCache, block_hashes, prompt_units
from disagg.sim.scheduler import Scheduler, SimRequest

SHAPE = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"), 1)


def test_a_block_names_its_whole_prefix() -> None:
    units = [f"u{i}" for i in range(50)]
    hashes = block_hashes(units, 16)
    assert len(hashes) == 3  # the last 2 units fill no block
    changed_late = block_hashes([*units[:40], "x", *units[41:]], 16)
    assert changed_late[:2] == hashes[:2] and changed_late[2] != hashes[2]
    changed_early = block_hashes(["x", *units[1:]], 16)
    assert not set(changed_early) & set(hashes)


def test_the_simulators_tokens_are_the_ones_it_counts() -> None:
    bodies = [
        {"prompt": "tell me more " * 37},
        {"prompt": ["first part", "second, longer part of it"]},
        {"prompt": [1, 2, 3, 4, 5]},
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "hello there"}]}]},
    ]  # fmt: skip
    for body in bodies:
        assert len(prompt_units(body)) == estimate_tokens(body), body


def test_pinned_blocks_stay_and_the_least_recently_used_go_first() -> None:
    cache = PrefixCache(capacity_blocks=4)
    a, b, c = (block_hashes([f"{k}{i}" for i in range(32)], 16) for k in "abc")
    assert cache.acquire(a) == 0 and cache.acquire(b) == 0
    assert cache.acquire(a) == 2  # a second request on the same prompt
    cache.release(a)
    cache.release(a)
    cache.release(b)
    cache.acquire(a)  # a is now the most recently used
    cache.release(a)
    assert cache.acquire(c) == 0  # full: b, the least recently used, makes room
    assert cache.cached_prefix(b) == 0 and cache.cached_prefix(a) == 2
    # Blocks in use are never evicted, even past capacity.
    assert cache.acquire(b) == 0 and cache.cached_prefix(c) == 2


def _scheduler() -> Scheduler:
    capacity = kv_capacity_tokens(SHAPE)
    return Scheduler(SHAPE, 8192, 64, capacity, prefix_cache=PrefixCache(capacity // 16))


def _serve(scheduler: Scheduler, request: SimRequest) -> float:
    """Run the request to its end; returns the model seconds of its first step."""
    scheduler.add(request)
    first = None
    while not request.finished:
        step = scheduler.plan()
        first = scheduler.duration(step) if first is None else first
        scheduler.complete(step)
    assert first is not None
    return first


def test_a_cached_prompt_is_not_computed_again() -> None:
    scheduler = _scheduler()
    units = prompt_units({"prompt": "a shared system prompt and a question " * 300})
    hashes = tuple(block_hashes(units, 16))
    cold = _serve(scheduler, SimRequest("r1", len(units), 2, block_hashes=hashes))
    warm = _serve(scheduler, SimRequest("r2", len(units), 2, block_hashes=hashes))
    assert warm < cold / 10, (cold, warm)
    # vLLM's counters: every prompt token is a query; the second prompt's blocks were hits.
    assert scheduler.prefix_queries == 2 * len(units)
    assert scheduler.prefix_hits == len(units) // 16 * 16


def test_the_engine_exports_vllms_prefix_cache_counters() -> None:
    config = EngineConfig(
        served_model_name="m", role="both", shape=SHAPE, max_num_batched_tokens=8192,
        max_num_seqs=8, kv_capacity_tokens=kv_capacity_tokens(SHAPE), time_scale=0.01,
        network=NETWORKS["ib400"], prefix_caching=True,
    )  # fmt: skip
    units = prompt_units({"prompt": "the same question again " * 100})
    hashes = tuple(block_hashes(units, 16))

    async def twice() -> Engine:
        engine = Engine(config)
        await engine.start("127.0.0.1")
        for name in ("a", "b"):
            request = SimRequest(name, len(units), 2, block_hashes=hashes)
            async for _ in engine.run(request, time.monotonic()):
                pass
        await engine.close()
        return engine

    text = generate_latest(asyncio.run(twice()).metrics.registry).decode()
    hits = len(units) // 16 * 16
    assert (
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {2.0 * len(units)}' in text
    )
    assert f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {float(hits)}' in text
