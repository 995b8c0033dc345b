"""One trace per request across the router and the engines (OpenTelemetry; off unless the
router is given ``--otlp-endpoint``).

The router continues the W3C ``traceparent`` a request arrives with, or starts a trace, and
records a server span for the request (attributes: the model, the path it took, the engines,
prompt and cached tokens, the TTFT the client saw) with a child for each leg:

* ``prefill``: the call to a prefill engine (one per attempt);
* ``kv_handoff``: from the prefill engine's answer (SGLang: from both calls leaving) until the
  decode engine's first token, which is the KV transfer and the first decode step, with the
  connector's ``kv_transfer_params`` as attributes;
* ``decode``: the call to a decode engine and its stream (one per attempt).

Every call to an engine carries the ``traceparent`` of its span, so the engines' own spans
(vLLM and SGLang both continue the one in the request's headers) sit under it.

Exporting is :mod:`disagg.otel`'s (the SDK is the ``tracing`` extra, which the router's
image carries).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from disagg.otel import TracingUnavailable, configure, incoming, outgoing

TRACER = trace.get_tracer("disagg.router")
KV_PARAMS = ("remote_engine_id", "remote_host", "remote_port")
"""``kv_transfer_params`` keys recorded on the hand-off span (the block IDs are counted)."""


@contextlib.contextmanager
def leg(name: str, engine: str, **attributes: Any) -> Iterator[Span]:
    """A client span for one call to an engine, current while the call runs; an exception
    that leaves it marks it failed."""
    with TRACER.start_as_current_span(
        name,
        kind=SpanKind.CLIENT,
        attributes={"disagg.engine": engine, **attributes},
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


def failed(span: Span, failure: BaseException) -> None:
    """Mark a span failed by an error the code handles (and so does not let leave it)."""
    span.record_exception(failure)
    span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"))


def handoff(request: Span, params: Mapping[str, Any] | None) -> Span:
    """The KV hand-off span, started now under the request's span (the caller ends it at
    the first token, or when the attempt fails)."""
    attributes: dict[str, Any] = {}
    for key in KV_PARAMS:
        value = (params or {}).get(key)
        if isinstance(value, str | int | float | bool):
            attributes[f"disagg.kv.{key}"] = value
    blocks = (params or {}).get("remote_block_ids")
    if isinstance(blocks, list):
        attributes["disagg.kv.blocks"] = len(blocks)
    return TRACER.start_span(
        "kv_handoff", context=trace.set_span_in_context(request), attributes=attributes
    )


def end(span: Span | None) -> None:
    """End ``span`` unless it has ended (or is not recorded)."""
    if span is not None and span.is_recording():
        span.end()


@contextlib.contextmanager
def until_first_token(
    request: Span, arrival: float, handoff: Span | None, also: Callable[[], None]
) -> Iterator[Callable[[], None]]:
    """What the relay calls at the first token: ``also``, the hand-off span ends, and the
    request's span records the TTFT (seconds since ``arrival``, on the monotonic clock). An
    attempt that leaves the block before its first token ends the hand-off there."""

    def first_token() -> None:
        also()
        end(handoff)
        request.set_attribute("disagg.ttft_seconds", time.monotonic() - arrival)

    try:
        yield first_token
    finally:
        end(handoff)


__all__ = [
    "TRACER",
    "Span",
    "SpanKind",
    "TracingUnavailable",
    "configure",
    "end",
    "failed",
    "handoff",
    "incoming",
    "leg",
    "outgoing",
    "until_first_token",
]
