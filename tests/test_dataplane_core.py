"""The pure parts of the data plane: latency model, scheduler, P/D protocol, endpoint picking."""

from __future__ import annotations

import random

import pytest

from disagg.perf import (
    NETWORKS,
    EngineShape,
    PrefillChunk,
    gpu_profile,
    kv_capacity_tokens,
    model_profile,
    step_time,
    transfer_time,
)
from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.protocol import (
    PREFILL_KV_PARAMS,
    decode_request,
    parse_body,
    prefill_request,
    sglang_request,
    validate,
)
from disagg.routing.tokens import estimate_tokens
from disagg.sim.scheduler import Scheduler, SimRequest

H100_8B = EngineShape(model_profile("llama-3.1-8b"), gpu_profile("h100"), 1)


def test_kv_bytes_per_token_match_the_design_card() -> None:
    assert model_profile("meta-llama/Llama-3.1-8B-Instruct").kv_bytes_per_token() == 128 * 1024
    assert model_profile("llama-3.1-70b").kv_bytes_per_token() == 320 * 1024
    assert model_profile("deepseek-v3").kv_bytes_per_token() == 70_272
    with pytest.raises(KeyError, match="known: deepseek-v3"):
        model_profile("gpt-9")


def test_roofline_decode_step_by_hand() -> None:
    # B=64 at 2k context on one H100: bytes = 16.06 GB weights + 64*2048*128 KiB KV, read at 80%
    # of 3.35 TB/s; that is memory-bound, plus the 3 ms decode overhead.
    weights = 8.03e9 * 2
    kv = 64 * 2048 * 131072
    expected = 0.003 + (weights + kv) / (3.35e12 * 0.8)
    assert step_time(H100_8B, [], [2048] * 64) == pytest.approx(expected, rel=1e-9)


def test_prefill_is_compute_bound_and_stalls_a_mixed_step() -> None:
    decode_only = step_time(H100_8B, [], [2048] * 32)
    mixed = step_time(H100_8B, [PrefillChunk(8192)], [2048] * 32)
    assert mixed > 10 * decode_only
    assert kv_capacity_tokens(H100_8B) > 100_000
    slow, fast = (
        transfer_time(H100_8B, 8192, NETWORKS["tcp"]),
        transfer_time(H100_8B, 8192, NETWORKS["ib400"]),
    )
    assert slow > 20 * fast


def test_scheduler_budget_admission_and_chunking() -> None:
    scheduler = Scheduler(
        H100_8B, max_num_batched_tokens=512, max_num_seqs=2, kv_capacity_tokens=10_000
    )
    long = SimRequest("long", prompt_tokens=1200, max_tokens=2)
    short = SimRequest("short", prompt_tokens=10, max_tokens=3)
    third = SimRequest("third", prompt_tokens=10, max_tokens=1)
    for r in (long, short, third):
        scheduler.add(r)
    step = scheduler.plan()
    assert [(r.id, n) for r, n in step.chunks] == [("long", 512)]
    assert len(scheduler.running) == 1, "the budget was spent on the long prompt"
    scheduler.complete(step)
    step = scheduler.plan()
    assert [(r.id, n) for r, n in step.chunks] == [("long", 512)]
    scheduler.complete(step)
    step = scheduler.plan()
    assert [(r.id, n) for r, n in step.chunks] == [("long", 176), ("short", 10)]
    assert "third" in [r.id for r in scheduler.waiting], "max_num_seqs=2"
    result = scheduler.complete(step)
    assert {(r.id, i) for r, i in result.emitted} == {("long", 0), ("short", 0)}


def test_remote_kv_requests_skip_prefill_and_lent_kv_is_held() -> None:
    scheduler = Scheduler(H100_8B, 512, 8, kv_capacity_tokens=5000)
    decode = SimRequest("d", prompt_tokens=4000, max_tokens=2, kv_ready=True)
    scheduler.add(decode)
    step = scheduler.plan()
    assert step.decodes == [decode] and not step.chunks
    scheduler.complete(step)
    scheduler.complete(scheduler.plan())
    assert decode.finished and scheduler.kv_used == 0
    prefill = SimRequest("p", prompt_tokens=100, max_tokens=1, hold_kv=True)
    scheduler.add(prefill)
    scheduler.complete(scheduler.plan())
    assert scheduler.kv_held == 100
    scheduler.release_held(100)
    assert scheduler.usage == 0
    with pytest.raises(ValueError, match="KV tokens"):
        scheduler.add(SimRequest("huge", prompt_tokens=6000, max_tokens=1))


def test_prefill_and_decode_request_shapes() -> None:
    body = {
        "model": "m",
        "prompt": "x",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "min_tokens": 3,
    }
    prefill = prefill_request(body)
    assert prefill == {
        "model": "m",
        "prompt": "x",
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": PREFILL_KV_PARAMS,
    }
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": "e",
        "remote_block_ids": [[1, 2]],
        "future_key": 7,
    }
    decode = decode_request(body, params)
    assert (
        decode["kv_transfer_params"] is params
        and decode["max_tokens"] == 50
        and decode["min_tokens"] == 3
    )
    assert body.get("kv_transfer_params") is None, "the original request is not modified"
    paired = sglang_request(body, "10.0.0.1", 8998, 42)
    assert (
        paired["bootstrap_host"] == "10.0.0.1"
        and paired["bootstrap_room"] == 42
        and paired["max_tokens"] == 50
    )


def test_validation_messages() -> None:
    assert validate({"model": "m", "prompt": "x"}, "completion", "m") is None
    assert validate({"model": "n", "prompt": "x"}, "completion", "m") == (
        404,
        "The model `n` does not exist.",
    )
    assert validate({"model": "m"}, "chat", None) == (
        400,
        "messages is required and must be a non-empty list",
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "m", "messages": [1]}, "messages[0] must be an object"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": "m", "prompt": [""]}, "prompt[0] must be a non-empty string"),
        ({"model": "m", "prompt": [[]]}, "prompt[0]"),
        (
            {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}},
            "only with stream",
        ),
        (
            {"model": "m", "prompt": "x", "max_tokens": True},
            "max_tokens must be a positive integer",
        ),
        ({"model": "m", "prompt": "x", "kv_transfer_params": {}}, "kv_transfer_params is set by"),
    ],
)
def test_requests_the_engines_would_hang_or_fail_on_are_refused(
    body: dict[str, object], fragment: str
) -> None:
    kind = "chat" if "messages" in body else "completion"
    problem = validate(body, kind, None)
    assert problem is not None and problem[0] == 400 and fragment in problem[1]


def test_accepted_prompt_forms_and_unreadable_bodies() -> None:
    for prompt in ("x", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        assert validate({"model": "m", "prompt": prompt}, "completion", None) is None
    assert parse_body(b'{"model": "m"}', "utf-8") == ({"model": "m"}, None)
    assert parse_body(b"{}", "nope")[1] == (415, "unsupported charset 'nope': send JSON as UTF-8")
    assert parse_body(b'{"a": "\xff"}', None)[1][0] == 400  # type: ignore[index]
    deep = b"[" * 65 + b"]" * 65
    assert parse_body(deep, None)[1] == (400, "the request body is nested deeper than 64 levels")
    assert parse_body(b"[" * 100_000 + b"]" * 100_000, None)[1][0] == 400  # type: ignore[index]
    huge = parse_body(b'{"n": ' + b"9" * 5000 + b"}", None)[1]
    assert huge is not None and huge[0] == 400 and "not valid JSON" in huge[1]


def test_token_estimate() -> None:
    assert estimate_tokens({"prompt": "abcd" * 100}) == 100
    assert estimate_tokens({"prompt": [1, 2, 3]}) == 3
    assert estimate_tokens({"messages": [{"role": "user", "content": "abcd" * 10}]}) == 14


def test_picker_prefers_the_less_loaded_and_skips_draining() -> None:
    pool = Pool("decode")
    busy, idle, leaving = (
        Endpoint("http://a:1", in_flight=9),
        Endpoint("http://b:1"),
        Endpoint("http://c:1", draining=True),
    )
    pool.replace([busy, idle, leaving])
    picker = Picker("least-outstanding", random.Random(1))
    picks = {picker.pick(pool).url for _ in range(20)}  # type: ignore[union-attr]
    assert picks == {"http://b:1"}
    assert picker.pick(pool, exclude={"http://a:1", "http://b:1"}) is None


def test_prefix_affinity_is_stable_until_overloaded() -> None:
    pool = Pool("decode")
    pool.replace([Endpoint(f"http://e{i}:1") for i in range(4)])
    picker = Picker("prefix-affinity", random.Random(2))
    first = picker.pick(pool, prefix="system prompt A")
    assert all(picker.pick(pool, prefix="system prompt A") is first for _ in range(10))
    assert first is not None
    first.in_flight = 50
    assert picker.pick(pool, prefix="system prompt A") is not first
