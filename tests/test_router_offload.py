"""Conditional disaggregation: how long a prompt would wait for the prefill pool, when a
decode engine prefills a short prompt itself instead, the router doing it against simulated
engines, and what it changes in the fleet simulator."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from disagg.router.state import Router, RouterConfig
from disagg.routing.offload import Offload, PrefillBacklog
from disagg.sim.fleet import Fleet
from disagg.sim.scenario import Scenario, build
from disagg.sim.traffic import Request, generate, step
from simengines import Stack, prompt_tokens, router_stack

# --- the wait estimate ------------------------------------------------------------------------


def _busy_engine(backlog: PrefillBacklog, key: str = "p") -> None:
    """Ten 1000-token prompts sent at t=0, one finished each second until t=5."""
    for _ in range(10):
        backlog.sent(key, 1000, 0.0)
    for t in range(1, 6):
        backlog.finished(key, 1000, float(t))


def test_a_prompt_waits_for_the_tokens_in_flight_over_the_rate_they_are_finished() -> None:
    backlog = PrefillBacklog()
    _busy_engine(backlog)
    wait = backlog.wait("p", 5.0)
    assert wait is not None and 4.5 < wait < 5.5, "5000 tokens in flight at 1000 tokens/s"


def test_an_idle_engine_has_no_wait_and_an_unmeasured_one_has_no_estimate() -> None:
    backlog = PrefillBacklog()
    assert backlog.wait("new", 0.0) == 0.0
    backlog.sent("new", 4000, 0.0)
    assert backlog.wait("new", 1.0) is None, "nothing finished yet: no rate to divide by"
    backlog.finished("new", 4000, 2.0, served=False)
    assert backlog.wait("new", 2.0) == 0.0, "a failed prompt no longer waits there"
    backlog.sent("new", 4000, 3.0)
    assert backlog.wait("new", 3.0) is None, "and it taught nothing about the engine's speed"


def test_routers_that_each_see_half_of_the_traffic_estimate_the_same_wait() -> None:
    whole, halves = PrefillBacklog(), [PrefillBacklog(), PrefillBacklog()]
    for i in range(10):
        whole.sent("p", 1000, 0.0)
        halves[i % 2].sent("p", 1000, 0.0)
    for t in range(1, 7):
        whole.finished("p", 1000, float(t))
        halves[t % 2].finished("p", 1000, float(t))
    one = whole.wait("p", 6.0)
    both = [half.wait("p", 6.0) for half in halves]
    assert one is not None and all(w is not None and abs(w - one) < 0.25 * one for w in both)


def test_the_least_backed_up_engine_decides_and_an_unknown_one_holds_back() -> None:
    backlog = PrefillBacklog()
    _busy_engine(backlog, "a")
    _busy_engine(backlog, "b")
    backlog.finished("b", 3000, 5.0)
    wait_b = backlog.wait("b", 5.0)
    assert backlog.least_wait(["a", "b"], 5.0) == wait_b
    backlog.sent("c", 500, 5.0)
    assert backlog.least_wait(["a", "b", "c"], 5.0) is None, "c may be fast; nothing known"
    assert backlog.least_wait([], 5.0) is None
    backlog.forget({"a"})
    assert set(backlog.engines) == {"a"}


@pytest.mark.parametrize(
    ("tokens", "wait", "wanted"),
    [(500, 2.0, True), (2048, 2.0, True), (2049, 2.0, False), (500, 1.0, False),
     (500, None, False), (0, 2.0, False)],
)  # fmt: skip
def test_only_short_prompts_skip_a_prefill_pool_that_makes_them_wait(
    tokens: int, wait: float | None, wanted: bool
) -> None:
    assert Offload(2048, 1.0).wanted(tokens, wait) is wanted


# --- the router against simulated engines ----------------------------------------------------


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    config = RouterConfig(served_model_name="m", offload=Offload(2048, 1.0))
    async with router_stack(("prefill", "decode", "decode"), config) as served:
        yield served


def _backed_up(router: Router, seconds: float) -> None:
    """The prefill engine finished 1000 tokens in the last second and holds ``seconds``
    more of them."""
    url = next(iter(router.prefill.endpoints))
    now = time.monotonic()
    router.backlog.sent(url, 1000, now - 1.0)
    router.backlog.finished(url, 1000, now)
    router.backlog.sent(url, round(1000 * seconds), now)


async def _path(client: TestClient[web.Request, web.Application], words: int, stream: bool) -> str:
    body: dict[str, Any] = {
        "model": "m", "prompt": "tok " * words, "max_tokens": 4, "stream": stream
    }  # fmt: skip
    response = await client.post("/v1/completions", json=body)
    assert response.status == 200, await response.text()
    await response.read()
    return response.headers["X-Disagg-Path"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_short_prompt_skips_a_backed_up_prefill_pool(stack: Stack, stream: bool) -> None:
    client, router, engines = stack
    prefill = next(e for e in engines.values() if e.config.role == "prefill")
    _backed_up(router, seconds=30)
    before = prompt_tokens(prefill)
    assert await _path(client, 1000, stream) == "offloaded"  # ~1000 tokens
    assert prompt_tokens(prefill) == before, "the prefill engine computed nothing"
    decode_tokens = sum(prompt_tokens(e) for e in engines.values() if e.config.role == "decode")
    assert decode_tokens >= 900, "a decode engine computed the prompt"
    assert all(e.local_prefills == 0 for e in router.decode.endpoints.values())
    assert await _path(client, 4000, stream) == "disaggregated", "too long to offload"
    text = await (await client.get("/metrics")).text()
    assert 'disagg_router_requests_total{code="200",path="offloaded"} 1.0' in text
    view = await (await client.get("/debug/endpoints")).json()
    assert view["prefill"][0]["wait_seconds"] > 1.0, "what the router decides on, shown"
    assert view["prefill"][0]["in_flight_tokens"] >= 30_000
    assert [row["local_prefills"] for row in view["decode"]] == [0, 0]


async def test_no_offload_while_the_prefill_pool_keeps_up_or_no_decode_engine_has_room(
    stack: Stack,
) -> None:
    client, router, _ = stack
    _backed_up(router, seconds=0.5)
    assert await _path(client, 1000, False) == "disaggregated", "under the 1 s wait"
    _backed_up(router, seconds=30)
    for endpoint in router.decode.endpoints.values():
        endpoint.local_prefills = 1  # each already prefills one offloaded prompt
    assert await _path(client, 1000, False) == "disaggregated"


# --- the fleet simulator ---------------------------------------------------------------------


def _step_traffic() -> list[Request]:
    return [
        Request(r.arrival, r.prompt_tokens, r.output_tokens)
        for r in generate("chat", 6, 900, seed=21, shape=step(300, 3.0))
    ]


def test_decode_engines_absorb_a_step_the_prefill_pool_cannot_serve_alone() -> None:
    base = Scenario(
        model="llama-3.1-8b", workload="chat", duration=900, ttft=1.0, tpot=0.03,
        policy="static", prefill_replicas=1, decode_replicas=1,
    )  # fmt: skip
    requests = _step_traffic()
    runs = {}
    for max_tokens in (0, 2048):
        fleet = Fleet(build(Scenario(**{**base.__dict__, "offload_max_tokens": max_tokens})))
        runs[max_tokens] = fleet.run(requests)
    without, with_offload = runs[0], runs[2048]
    assert not any(o.offloaded for o in without.outcomes)
    offloaded = [o for o in with_offload.outcomes if o.offloaded]
    assert offloaded and all(o.request.prompt_tokens <= 2048 for o in offloaded)
    before_step = [o for o in offloaded if o.request.arrival < 300]
    assert len(before_step) < 0.05 * len(offloaded), "a few in bursts; most after the step"
    before = without.attainment(1.0, 0.03)[2]
    after = with_offload.attainment(1.0, 0.03)[2]
    assert before < 0.95 and after > 0.99, (before, after)


def test_prompts_under_the_pd_threshold_never_reach_the_prefill_pool() -> None:
    scenario = Scenario(model="llama-3.1-8b", workload="chat", duration=300, policy="static")
    requests = _step_traffic()[:400]
    result = Fleet(build(scenario)).run(requests)
    short = [o for o in result.outcomes if o.request.prompt_tokens < scenario.pd_threshold]
    assert short and all(o.prefill_done is None and o.first_token for o in short)
    assert all(
        o.prefill_done is not None
        for o in result.outcomes
        if o.request.prompt_tokens >= scenario.pd_threshold and not o.offloaded
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--offload-wait", "0"], "--offload-wait must be a positive number of seconds, got 0.0"),
     (["--offload-wait", "nan"], "--offload-wait must be a positive number of seconds"),
     (["--offload-max-tokens", "-1"], "--offload-max-tokens must be >= 0, got -1"),
     (["--offload-per-decode", "0"], "--offload-per-decode must be at least 1, got 0")],
)  # fmt: skip
def test_the_router_refuses_offload_flags_that_make_no_sense(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from disagg.cli import main

    assert main(["router", "--decode", "http://127.0.0.1:1", *flags]) == 2
    assert message in capsys.readouterr().err
