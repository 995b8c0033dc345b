"""Cache-aware routing: the router's record of what it sent where, the engine it picks from
that record and from load, when a decode engine prefills a follow-up turn itself, and the
whole path against in-process simulated engines with their prefix caches."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from disagg.router.app import build_app
from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.metrics import RouterMetrics
from disagg.router.prompt_blocks import (
    CharacterReader,
    TokenizerUnavailable,
    prompt_reader,
)
from disagg.router.relay import Answer
from disagg.router.state import Router, RouterConfig
from disagg.routing.affinity import (
    DECODE_SLACK,
    AffinityRecord,
    LocalPrefill,
    choose,
    decode_alone,
)
from disagg.routing.prompt import Prompt
from disagg.sim.engine import Engine
from simengines import serve_engine

SYSTEM = "You are a careful assistant who answers in short, plain sentences. " * 8


def _chat(*turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages, "max_tokens": 4}


def _prompt(blocks: int, tokens: int | None = None, tag: str = "a") -> Prompt:
    return Prompt(tokens or 16 * blocks, tuple(f"{tag}{i}".encode() for i in range(blocks)))


def test_a_follow_up_turn_starts_with_the_blocks_of_the_turn_before() -> None:
    reader = CharacterReader()
    first = reader.read(_chat("What is disaggregated serving? " * 4))
    second = reader.read(
        _chat("What is disaggregated serving? " * 4, "Prefill and decode apart. " * 20, "Why?")
    )
    assert len(first.blocks) >= 8
    assert second.blocks[: len(first.blocks)] == first.blocks
    other = reader.read({"model": "m", "prompt": "entirely different text " * 40})
    assert not set(other.blocks) & set(first.blocks)
    ids = reader.read({"model": "m", "prompt": list(range(40))})
    assert (ids.tokens, len(ids.blocks)) == (40, 2)


def test_the_record_counts_leading_blocks_and_stays_bounded() -> None:
    record = AffinityRecord(budget=2048)
    prompt = _prompt(10)
    record.note("http://a", prompt.blocks[:6])
    assert record.held("http://a", prompt.blocks) == 6
    assert record.held("http://b", prompt.blocks) == 0
    gap = (prompt.blocks[0], b"other", *prompt.blocks[2:])
    assert record.held("http://a", gap) == 1, "a block names its prefix: stop at the first miss"
    for n in range(3000):
        record.note("http://a", [f"filler{n}".encode()])
    assert record.blocks("http://a") == 2048, "one engine may use the whole budget"
    assert record.held("http://a", prompt.blocks) == 0, "least recently sent went first"
    record.note("http://b", prompt.blocks)
    record.note("http://b", [b"one more"])
    assert record.blocks("http://b") <= 1024, "two engines share the budget"
    record.retain({"http://b"})
    assert record.blocks("http://a") == 0 and record.engines == {"http://b"}


def test_the_engine_holding_the_prefix_wins_unless_it_is_overloaded() -> None:
    record = AffinityRecord()
    prompt = _prompt(8)
    record.note("http://b", prompt.blocks)
    rng = random.Random(7)
    busy = choose([("http://a", 2), ("http://b", 5), ("http://c", 3)], record, prompt, rng)
    assert busy is not None and (busy.url, busy.held_blocks) == ("http://b", 8)
    over = choose([("http://a", 2), ("http://b", 7), ("http://c", 3)], record, prompt, rng)
    assert over is not None and over.url != "http://b", "4 more than the least busy is too many"
    at_scale = choose([("http://a", 40), ("http://b", 49)], record, prompt, rng)
    assert at_scale is not None and at_scale.url == "http://b", "slack grows with the load"
    decode = choose([("http://a", 2), ("http://b", 9)], record, prompt, rng, DECODE_SLACK)
    assert decode is not None and decode.url == "http://b", "a decode engine batches: it stays"
    too_far = choose([("http://a", 2), ("http://b", 11)], record, prompt, rng, DECODE_SLACK)
    assert too_far is not None and too_far.url == "http://a"


def test_with_nothing_cached_it_is_least_outstanding() -> None:
    record, rng = AffinityRecord(), random.Random(3)
    picks = [
        choose([("http://a", 0), ("http://b", 9)], record, _prompt(4, tag=str(n)), rng)
        for n in range(50)
    ]
    assert {p.url for p in picks if p is not None} == {"http://a"}


def test_local_prefill_is_decided_on_the_uncached_suffix() -> None:
    local = LocalPrefill(max_uncached_tokens=512, min_cached_fraction=0.5)
    follow_up = Prompt(3000, ())
    assert decode_alone(follow_up, 160, 16, 256, local) == "local-prefill"  # 440 uncached
    assert decode_alone(follow_up, 100, 16, 256, local) is None  # 1400 uncached
    assert decode_alone(follow_up, 160, 16, 256, None) is None, "local prefill off"
    short_suffix = Prompt(1000, ())
    assert decode_alone(short_suffix, 50, 16, 256, None) == "local-prefill", "under the threshold"
    mostly_new = Prompt(900, ())
    assert decode_alone(mostly_new, 20, 16, 256, local) is None, "a third cached is too little"
    assert decode_alone(Prompt(100, ()), 0, 16, 256, local) == "skipped"
    assert decode_alone(Prompt(300, ()), 0, 16, 256, local) is None


def test_the_relayed_answer_is_read_back_exactly() -> None:
    pieces = ["plain ", 'a "quote" and a \\ backslash ', "é ünï 😀 ", "\n"]
    events = [
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": p}}]}).encode()
        for p in pieces
    ]
    stream = b"\n\n".join([*events, b"data: [DONE]"]) + b"\n\n"
    answer = Answer()
    for start in range(0, len(stream), 7):  # chunks cut anywhere, even inside an event
        answer.feed(stream[start : start + 7])
    assert answer.text == "".join(pieces)
    cut_off = Answer()
    cut_off.feed(stream[: len(stream) // 2])
    assert cut_off.text is None, "a stream that broke off is no answer to record"
    whole = Answer()
    whole.whole(json.dumps({"choices": [{"text": "all of it"}]}).encode())
    assert whole.text == "all of it"


def test_the_model_tokenizer_counts_and_a_bad_one_is_named(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", "world", "<|user|>"])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    reader = prompt_reader(str(tmp_path), block_size=4)
    assert "tokenizer" in reader.description
    prompt = reader.read({"model": "m", "prompt": "hello world " * 10})
    assert (prompt.tokens, len(prompt.blocks)) == (20, 5)
    with pytest.raises(TokenizerUnavailable, match="no tokenizer file"):
        prompt_reader(str(tmp_path / "missing"))
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(TokenizerUnavailable, match="is not a tokenizer file"):
        prompt_reader(str(tmp_path / "junk.json"))


# --- the whole path, against simulated engines with prefix caching --------------------------


Stack = tuple[TestClient[web.Request, web.Application], dict[str, Engine]]


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    served = [await serve_engine(role) for role in ("prefill", "decode", "decode")]
    engines = {url: engine for engine, _, url in served}
    prefill, decode = Pool("prefill"), Pool("decode")
    prefill.replace([Endpoint(served[0][2])])
    decode.replace([Endpoint(served[1][2]), Endpoint(served[2][2])])
    router = Router(
        RouterConfig(served_model_name="m"), prefill, decode, Picker("cache-aware"), RouterMetrics()
    )
    client = TestClient(TestServer(build_app(router)))
    await client.start_server()
    yield client, engines
    await client.close()
    for engine, runner, _ in served:
        await engine.close()
        await runner.cleanup()


def _kv_bytes(engines: dict[str, Engine]) -> float:
    total = 0.0
    for engine in engines.values():
        text = engine.metrics.registry.get_sample_value(
            "vllm:nixl_bytes_transferred_sum", engine.metrics.labels
        )
        total += text or 0.0
    return total


async def _send(client: TestClient[web.Request, web.Application], body: dict[str, Any]) -> str:
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status == 200, await response.text()
    await response.read()
    return response.headers["X-Disagg-Path"]


async def test_a_conversation_stays_on_its_decode_engine_and_prefills_there(stack: Stack) -> None:
    client, engines = stack
    question = "Explain how the KV cache moves between the pools, in detail. " * 12
    answer = "It moves over RDMA once the prompt is computed. " * 8
    assert await _send(client, _chat(question)) == "disaggregated"
    moved_first = _kv_bytes(engines)
    assert moved_first > 0
    view = await (await client.get("/debug/endpoints")).json()
    holder = next(e["url"] for e in view["decode"] if e["cached_blocks"])
    assert view["policy"] == "cache-aware" and view["tokenizer"].startswith("estimate")

    turns = [question]
    for turn in range(2):
        turns += [answer, f"And then, what happens at step {turn}?"]
        assert await _send(client, _chat(*turns)) == "local-prefill"
    assert _kv_bytes(engines) == moved_first, "a local prefill moves no KV"
    holder_engine = engines[holder]
    assert holder_engine.scheduler.prefix_hits > 0, "the follow-ups hit the engine's cache"

    before = _kv_bytes(engines)
    turns += [answer, "Now read this long document and summarise it. " * 200]
    assert await _send(client, _chat(*turns)) == "disaggregated", "a long new suffix"
    whole = CharacterReader().read(_chat(*turns)).tokens * 128 * 1024
    moved = _kv_bytes(engines) - before
    assert 0 < moved < 0.95 * whole, "the decode engine fetches only what it does not hold"

    unrelated = {"model": "m", "messages": [{"role": "user", "content": "Other topic. " * 100}]}
    assert await _send(client, unrelated) == "disaggregated", "nothing cached: the P/D path"
    text = await (await client.get("/metrics")).text()
    assert re.search(r'disagg_router_requests_total\{code="200",path="local-prefill"\} 2\.0', text)


async def test_the_answer_is_cached_too_so_a_long_answer_stays_local(stack: Stack) -> None:
    client, engines = stack
    body = _chat("Walk me through a rollout of the decode pool, step by step. " * 14)
    body["max_tokens"] = 400
    response = await client.post("/v1/chat/completions", json=body)
    assert response.headers["X-Disagg-Path"] == "disaggregated"
    answer = (await response.json())["choices"][0]["message"]["content"]
    assert len(answer) > 4 * 520, "the answer alone is over the 512-token local-prefill limit"
    body["messages"] += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Thanks, and the rollback?"},
    ]
    body["max_tokens"] = 4
    hits_before = sum(e.scheduler.prefix_hits for e in engines.values())
    assert await _send(client, body) == "local-prefill", "router and engine both hold the answer"
    hits = sum(e.scheduler.prefix_hits for e in engines.values()) - hits_before
    prompt = CharacterReader().read(body).tokens
    assert hits >= prompt - 2 * 16 - 8, "all but the new question's blocks were cached"
