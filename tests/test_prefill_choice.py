"""Which prefill engine a prompt goes to: the one with the fewest prompt tokens in flight,
in the router (against simulated engines) and in the fleet simulator, which routes the same
way."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator

import pytest

from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.state import RouterConfig
from disagg.routing.affinity import AffinityRecord, choose, least_work
from disagg.routing.prompt import Prompt
from disagg.sim.fleet import Fleet
from disagg.sim.scenario import Scenario, build
from disagg.sim.traffic import Request
from simengines import Stack, prompt_tokens, router_stack


def test_the_engine_with_the_fewest_tokens_in_flight_wins_not_the_fewest_requests() -> None:
    # One engine computes a 100k-token prompt; the other holds three short ones.
    candidates = [("http://long", 1), ("http://short", 3)]
    work = {"http://long": 100_000.0, "http://short": 900.0}
    assert least_work(candidates, work) == "http://short"
    even = {"http://long": 900.0, "http://short": 900.0}
    assert least_work(candidates, even) == "http://long", "fewer requests break a tie"
    assert least_work([("b", 0), ("a", 0)], {}) == "b", "then the order given"


def test_cache_affinity_still_wins_within_its_slack_and_work_decides_without_it() -> None:
    record, rng = AffinityRecord(), random.Random(4)
    prompt = Prompt(64, tuple(bytes([n]) for n in range(4)))
    record.note("http://a", prompt.blocks)
    candidates = [("http://a", 2), ("http://b", 1)]
    work = {"http://a": 50_000.0, "http://b": 10.0}
    cached = choose(candidates, record, prompt, rng, work=work)
    assert cached is not None and cached.url == "http://a" and cached.held_blocks == 4
    fresh = Prompt(64, (b"other",))
    uncached = choose(candidates, record, fresh, rng, work=work)
    assert uncached is not None and uncached.url == "http://b"


def test_the_picker_takes_the_least_work_when_it_is_given() -> None:
    pool = Pool("prefill")
    pool.replace([Endpoint("http://a:1", in_flight=1), Endpoint("http://b:1", in_flight=4)])
    picker = Picker("least-outstanding", random.Random(5))
    by_requests = {picker.pick(pool).url for _ in range(20)}  # type: ignore[union-attr]
    assert by_requests == {"http://a:1"}
    work = {"http://a:1": 80_000.0, "http://b:1": 2_000.0}
    by_work = {picker.pick(pool, work=work).url for _ in range(20)}  # type: ignore[union-attr]
    assert by_work == {"http://b:1"}
    idle_pool = Pool("prefill")
    idle_pool.replace([Endpoint("http://c:1"), Endpoint("http://d:1")])
    idle = {"http://c:1": 0.0, "http://d:1": 0.0}
    shared = {picker.pick(idle_pool, work=idle).url for _ in range(20)}  # type: ignore[union-attr]
    assert shared == {"http://c:1", "http://d:1"}, "idle engines share the traffic"


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    config = RouterConfig(served_model_name="m")
    async with router_stack(("prefill", "prefill", "decode"), config) as served:
        yield served


async def test_the_router_sends_a_prompt_where_the_fewest_prompt_tokens_wait(
    stack: Stack,
) -> None:
    client, router, engines = stack
    busy_url, free_url = sorted(router.prefill.endpoints)
    # What this router has in flight: one 100k-token prompt at one engine, three short
    # prompts at the other. By requests the first looks the less busy.
    now = time.monotonic()
    router.backlog.sent(busy_url, 100_000, now)
    for _ in range(3):
        router.backlog.sent(free_url, 300, now)
    router.prefill.endpoints[busy_url].in_flight = 1
    router.prefill.endpoints[free_url].in_flight = 3
    before = {url: prompt_tokens(engines[url]) for url in (busy_url, free_url)}
    body = {"model": "m", "prompt": "tok " * 1000, "max_tokens": 4}
    response = await client.post("/v1/completions", json=body)
    assert response.status == 200, await response.text()
    assert response.headers["X-Disagg-Path"] == "disaggregated"
    assert prompt_tokens(engines[busy_url]) == before[busy_url]
    assert prompt_tokens(engines[free_url]) >= before[free_url] + 900


def test_short_prompts_do_not_wait_behind_a_long_one_while_another_engine_is_free() -> None:
    scenario = Scenario(
        model="llama-3.1-8b", duration=30, ttft=1.0, tpot=0.05, policy="static",
        prefill_replicas=2, decode_replicas=1, offload_max_tokens=0,
    )  # fmt: skip
    # A 60k-token prompt takes one 8B replica about three seconds; short prompts follow in
    # pairs, so by requests the second of each pair ties and goes to the older engine.
    requests = [Request(0.0, 60_000, 8)] + [
        Request(0.5 + 0.2 * n, 300, 8) for n in range(4) for _ in range(2)
    ]
    result = Fleet(build(scenario)).run(requests)
    long, *short = result.outcomes
    assert long.ttft is not None and long.ttft > 2.0
    worst = max(o.ttft or float("inf") for o in short)
    assert worst < 0.5, f"a short prompt waited {worst:.2f}s behind the long one"
