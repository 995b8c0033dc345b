"""Exporting OpenTelemetry traces from a process (the router, the engine simulator), and
carrying a trace across HTTP calls (W3C ``traceparent``).

The API package is a dependency: with no SDK set up, spans do nothing and cost a function
call. The SDK and the OTLP/HTTP exporter are the ``tracing`` extra; :func:`configure` says
so when they are missing. The exporter batches and sends from its own thread, never on the
event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context


class TracingUnavailable(Exception):
    """Tracing was asked for but the SDK is not installed."""


def configure(
    endpoint: str, ratio: float, service: str, attributes: Mapping[str, str]
) -> Callable[[], None]:
    """Export this process's spans to ``endpoint`` (the OTLP/HTTP traces URL), sampling
    ``ratio`` of the traces that do not arrive already decided (a parent's decision is
    followed); returns what flushes and stops the export, for the process's exit."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as missing:
        raise TracingUnavailable(
            f"tracing needs the OpenTelemetry SDK ({missing.name} is not installed): "
            "pip install 'disagg-operator[tracing]'"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, **attributes}),
        sampler=ParentBased(TraceIdRatioBased(ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint, timeout=10)))
    trace.set_tracer_provider(provider)
    return provider.shutdown


@contextlib.contextmanager
def exporting(
    endpoint: str | None, ratio: float, service: str, attributes: Mapping[str, str]
) -> Iterator[None]:
    """:func:`configure` for the block's duration (nothing when ``endpoint`` is None), and
    the spans still batched sent when it ends."""
    stop = configure(endpoint, ratio, service, attributes) if endpoint else None
    try:
        yield
    finally:
        if stop is not None:
            stop()


def incoming(headers: Mapping[str, str]) -> Context:
    """The trace a request arrives in (its ``traceparent``), if any."""
    return propagate.extract(headers)


def outgoing(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` plus the current span's ``traceparent``, for a call onwards."""
    carried = dict(headers)
    propagate.inject(carried)
    return carried
