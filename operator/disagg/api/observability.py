"""`spec.observability`: what the model's pods report beyond their metrics (request traces)."""

from __future__ import annotations

from pydantic import Field

from disagg.api.base import ApiModel

OTLP_HTTP_URL = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"


class TracingSpec(ApiModel):
    """OpenTelemetry traces of each request across the router and the engines."""

    endpoint: str = Field(
        pattern=OTLP_HTTP_URL,
        max_length=2048,
        description="The OTLP/HTTP traces endpoint, the whole URL (an OpenTelemetry "
        "Collector's is http://<collector>:4318/v1/traces). The router, and every engine "
        "(vLLM's --otlp-traces-endpoint, SGLang's with --enable-trace), send their spans "
        "there as http/protobuf.",
    )
    sampling_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="The share of requests traced, decided by the router from the trace ID "
        "(a request that arrives with a sampled traceparent is traced whatever this says); "
        "the engines follow the router's decision.",
    )


class ObservabilitySpec(ApiModel):
    """What the model's pods report beyond their metrics."""

    tracing: TracingSpec | None = Field(
        default=None,
        description="Trace requests with OpenTelemetry: one trace per request, with spans for "
        "the router, the prefill call, the KV hand-off and the decode stream, and the "
        "engines' own spans under them. Off when unset.",
    )
