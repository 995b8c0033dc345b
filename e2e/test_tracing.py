"""A model with ``spec.observability.tracing`` on: one request through the router is one trace
whose spans (the router's request, its prefill, KV hand-off and decode legs, and each
engine's own span under the leg that called it) arrive at an OTLP/HTTP receiver.

Real pieces: the API server, the operator, the pod emulator running ``disagg router`` and the
engine simulators with the rendered arguments and the pods' OTEL_* environment, the router's
and the engines' OpenTelemetry SDKs exporting over HTTP, and a minimal OTLP/HTTP receiver
here (the Collector's protobuf request, decoded with the OpenTelemetry proto package).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from disagg.demo.procs import long_prompt
from disagg.devcluster.layout import free_port
from harness import Kube, condition, emulated_pods, example, scoped_operator, wait_for

MODEL = "traced"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@dataclass(frozen=True)
class Received:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


@dataclass
class Receiver:
    """OTLP/HTTP traces, as an OpenTelemetry Collector's receiver takes them on /v1/traces."""

    port: int
    spans: list[Received] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                kind = self.headers.get("Content-Type", "")
                if self.path != "/v1/traces" or kind != "application/x-protobuf":
                    receiver.refused.append(f"{self.path} {kind}")
                    self.send_response(415)
                    self.end_headers()
                    return
                receiver.take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: object) -> None:
                pass

        return Handler

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    self.spans.append(
                        Received(
                            service, span.name, span.trace_id.hex(), span.span_id.hex(),
                            span.parent_span_id.hex(), attributes,
                        )
                    )  # fmt: skip


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver(free_port())
    server = ThreadingHTTPServer(("127.0.0.1", receiver.port), receiver.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def emulated(namespace: str) -> Iterator[None]:
    with emulated_pods(namespace, "tracing", 0.2):
        yield


def _manifest(endpoint: str) -> dict[str, Any]:
    manifest = example("minimal")
    manifest["metadata"]["name"] = MODEL
    spec = manifest["spec"]
    spec["model"] = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": MODEL}
    spec["autoscaling"] = {"enabled": False}
    spec["network"] = {"transport": "tcp", "shmSize": "1Gi"}
    spec["router"] = {"replicas": 1, "prefillThresholdTokens": 256, "policy": "round-robin"}
    spec["observability"] = {"tracing": {"endpoint": endpoint, "samplingRatio": 1}}
    return manifest


def _ready(kube: Kube, namespace: str) -> bool:
    model = kube.get("dm", MODEL, namespace) or {}
    ready = condition(model, "Ready") or {}
    return ready.get("status") == "True"


def _router_url(kube: Kube, namespace: str) -> str | None:
    pods = kube.items("pods", namespace, "disagg.dev/role=router")
    ready = [
        p
        for p in pods
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]
    return f"http://{ready[0]['status']['podIP']}:8000" if ready else None


def test_one_request_is_one_trace_from_the_router_through_both_engines(
    kube: Kube, namespace: str, emulated: None, receiver: Receiver
) -> None:
    operator = scoped_operator(kube, namespace, "operator-tracing")
    try:
        endpoint = f"http://127.0.0.1:{receiver.port}/v1/traces"
        kube.apply(yaml.safe_dump(_manifest(endpoint)), namespace)
        wait_for("the traced model to be Ready", lambda: _ready(kube, namespace), timeout=120)
        wait_for("a ready router pod", lambda: _router_url(kube, namespace), timeout=60)
        url = _router_url(kube, namespace)
        body = {"model": MODEL, "prompt": long_prompt(2000), "max_tokens": 8, "stream": True}
        headers = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}
        answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Disagg-Path"] == "disaggregated"

        def traced(service: str, name: str) -> list[Received]:
            return [
                s
                for s in receiver.spans
                if s.trace_id == TRACE_ID and s.service == service and s.name == name
            ]

        wanted = [
            (f"{MODEL}-router", "POST /v1/completions"),
            (f"{MODEL}-router", "prefill"),
            (f"{MODEL}-router", "kv_handoff"),
            (f"{MODEL}-router", "decode"),
            (f"{MODEL}-prefill", "llm_request"),
            (f"{MODEL}-decode", "llm_request"),
        ]
        wait_for(
            "every span of the request at the receiver",
            lambda: all(len(traced(*w)) == 1 for w in wanted),
            timeout=60,
        )
        assert receiver.refused == []
        (request,) = traced(f"{MODEL}-router", "POST /v1/completions")
        assert request.parent_id == CALLER_SPAN
        assert request.attributes["disagg.path"] == "disaggregated"
        assert request.attributes["disagg.ttft_seconds"] > 0
        legs = {
            name: traced(f"{MODEL}-router", name)[0] for name in ("prefill", "kv_handoff", "decode")
        }
        assert {leg.parent_id for leg in legs.values()} == {request.span_id}
        (prefill_engine,) = traced(f"{MODEL}-prefill", "llm_request")
        (decode_engine,) = traced(f"{MODEL}-decode", "llm_request")
        assert prefill_engine.parent_id == legs["prefill"].span_id
        assert decode_engine.parent_id == legs["decode"].span_id
        assert decode_engine.attributes["disagg.kv_from_remote"] is True
        assert legs["kv_handoff"].attributes["disagg.kv.blocks"] > 0
    finally:
        operator.stop()
