"""One trace per request: the router's spans and the simulated engines' under them, over real
HTTP, recorded by an in-memory exporter (the e2e exports them over OTLP to a receiver)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from disagg.router.state import RouterConfig
from simengines import router_stack

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
BODY = {"model": "m", "prompt": "a long prompt " * 200, "max_tokens": 3, "stream": True}

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process: this module's, for every test in it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def _one(found: list[ReadableSpan], name: str, **attributes: object) -> ReadableSpan:
    matching = [
        s
        for s in found
        if s.name == name and all((s.attributes or {}).get(k) == v for k, v in attributes.items())
    ]
    assert len(matching) == 1, [(s.name, dict(s.attributes or {})) for s in found]
    return matching[0]


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_request_is_one_trace_with_the_engines_spans_under_the_router_legs(
    spans: InMemorySpanExporter,
) -> None:
    config = RouterConfig(served_model_name="m", pd_threshold=16, local_prefill=None)
    async with router_stack(["prefill", "decode"], config) as (client, _, engines):
        answer = await client.post(
            "/v1/completions",
            json=BODY,
            headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"},
        )
        assert answer.status == 200
        await answer.read()
    prefill_url, decode_url = list(engines)
    found = list(spans.get_finished_spans())
    assert {format(s.context.trace_id, "032x") for s in found} == {TRACE_ID}

    request = _one(found, "POST /v1/completions")
    assert request.kind == SpanKind.SERVER and _parent(request) == int(CALLER_SPAN, 16)
    attributes = request.attributes or {}
    assert attributes["disagg.path"] == "disaggregated"
    assert attributes["disagg.decode_engine"] == decode_url
    assert attributes["disagg.ttft_seconds"] > 0  # type: ignore[operator]
    assert attributes["disagg.prompt_tokens"] > 16  # type: ignore[operator]

    prefill = _one(found, "prefill")
    handoff = _one(found, "kv_handoff")
    decode = _one(found, "decode")
    for leg in (prefill, handoff, decode):
        assert _parent(leg) == request.context.span_id
    assert (prefill.attributes or {})["disagg.engine"] == prefill_url
    assert (handoff.attributes or {})["disagg.kv.remote_host"] == "127.0.0.1"
    assert (handoff.attributes or {})["disagg.kv.blocks"] > 0  # type: ignore[operator]
    assert (decode.attributes or {})["disagg.kv_handed_over"] is True
    assert prefill.end_time <= handoff.start_time <= handoff.end_time <= decode.end_time  # type: ignore[operator]

    prefill_engine = _one(found, "llm_request", **{"disagg.role": "prefill"})
    decode_engine = _one(found, "llm_request", **{"disagg.role": "decode"})
    assert _parent(prefill_engine) == prefill.context.span_id
    assert _parent(decode_engine) == decode.context.span_id
    assert (decode_engine.attributes or {})["disagg.kv_from_remote"] is True


async def test_without_a_traceparent_the_router_starts_the_trace(
    spans: InMemorySpanExporter,
) -> None:
    config = RouterConfig(served_model_name="m", pd_threshold=10_000, local_prefill=None)
    async with router_stack(["prefill", "decode"], config) as (client, _, _engines):
        answer = await client.post("/v1/completions", json={**BODY, "stream": False})
        assert answer.status == 200
    found = list(spans.get_finished_spans())
    request = _one(found, "POST /v1/completions")
    assert request.parent is None
    assert (request.attributes or {})["disagg.path"] == "skipped"
    assert not [s for s in found if s.name in ("prefill", "kv_handoff")]
    assert (_one(found, "decode").attributes or {})["disagg.kv_handed_over"] is False


async def test_a_failed_prefill_is_an_error_span_and_the_fallback_says_so(
    spans: InMemorySpanExporter,
) -> None:
    config = RouterConfig(served_model_name="m", pd_threshold=16, local_prefill=None)
    async with router_stack(["prefill", "decode"], config) as (client, _, engines):
        next(e for e in engines.values() if e.config.role == "prefill").faults.error_rate = 1.0
        answer = await client.post("/v1/completions", json={**BODY, "stream": False})
        assert answer.status == 200
    found = list(spans.get_finished_spans())
    failed = [s for s in found if s.name == "prefill"]
    assert failed and all(s.status.status_code == StatusCode.ERROR for s in failed)
    assert "HTTP 500" in (failed[0].status.description or "")
    request = _one(found, "POST /v1/completions")
    assert (request.attributes or {})["disagg.path"] == "fallback"
    assert not [s for s in found if s.name == "kv_handoff"]
