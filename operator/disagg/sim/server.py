"""The simulator's OpenAI-compatible HTTP API, shaped like ``vllm serve``.

Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (streaming and not), ``/v1/models``,
``/health``, ``/metrics``, and ``/admin/faults`` / ``/admin/state`` for tests. The NIXL P/D
protocol rides on ``kv_transfer_params``: ``do_remote_decode`` makes this engine the prefill
side (one token, KV lent), ``do_remote_prefill`` makes it the decode side (KV fetched first).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from typing import Any

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from disagg import otel
from disagg.routing.tokens import estimate_tokens, output_token
from disagg.sim.answers import full_answer, stream_chunk
from disagg.sim.engine import Engine
from disagg.sim.kvchannel import KvFetchError
from disagg.sim.prefix_cache import block_hashes, prompt_units
from disagg.sim.scheduler import SimRequest

log = logging.getLogger("disagg.sim")
ENGINE_KEY = web.AppKey("engine", Engine)
TRACER = trace.get_tracer("disagg.sim")
DEFAULT_MAX_TOKENS = 16
REQUIRED_DECODE_PARAMS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


def error(status: int, message: str, type_: str = "BadRequestError") -> web.Response:
    """An error in OpenAI's shape."""
    body = {"error": {"message": message, "type": type_, "param": None, "code": status}}
    return web.json_response(body, status=status)


def _max_tokens(body: dict[str, Any]) -> int | str:
    value = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"max_tokens must be a positive integer, got {value!r}"
    return value


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    """One request, in a span under the caller's (a no-op unless tracing is set up)."""
    engine = request.app[ENGINE_KEY]
    with TRACER.start_as_current_span(
        "llm_request",
        context=otel.incoming(request.headers),
        kind=SpanKind.SERVER,
        attributes={"disagg.role": engine.config.role, "http.route": request.path},
    ) as span:
        response = await _serve(request, kind, engine, span)
        span.set_attribute("http.response.status_code", response.status)
        return response


async def _serve(request: web.Request, kind: str, engine: Engine, span: Span) -> web.StreamResponse:
    arrival = time.monotonic()
    if engine.faults.crash_after is not None and engine.accepted >= engine.faults.crash_after:
        log.error("Crashing on purpose after %d requests (fault injection)", engine.accepted)
        os._exit(3)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error(400, "the request body is not valid JSON")
    if not isinstance(body, dict):
        return error(400, "the request body must be a JSON object")
    headers = {k.lower(): v for k, v in request.headers.items()}
    engine.recent.append({"path": request.path, "headers": headers, "body": body})
    config = engine.config
    if body.get("model") != config.served_model_name:
        return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    if kind == "chat" and not isinstance(body.get("messages"), list):
        return error(400, "messages is required and must be a list")
    if kind == "completion" and "prompt" not in body:
        return error(400, "prompt is required")
    max_tokens = _max_tokens(body)
    if isinstance(max_tokens, str):
        return error(400, max_tokens)
    if engine.should_fail():
        return error(500, "injected failure", "InternalServerError")

    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    internal_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}"
    prompt_tokens = estimate_tokens(body)
    params = body.get("kv_transfer_params") or {}
    remote_decode = bool(params.get("do_remote_decode"))
    remote_prefill = bool(params.get("do_remote_prefill"))
    if remote_decode and config.role == "decode":
        return error(400, "this engine is a KV consumer (decode); it cannot serve do_remote_decode")
    if remote_prefill and config.role == "prefill":
        return error(
            400, "this engine is a KV producer (prefill); it cannot serve do_remote_prefill"
        )
    blocks = (
        tuple(block_hashes(prompt_units(body), config.block_size)) if config.prefix_caching else ()
    )
    if remote_prefill:
        missing = [k for k in REQUIRED_DECODE_PARAMS if params.get(k) in (None, "")]
        if missing:
            return error(400, f"kv_transfer_params lacks {', '.join(missing)}")
        try:
            await engine.load_remote_kv(
                str(params["remote_host"]),
                int(params["remote_port"]),
                str(params["remote_request_id"]),
                prompt_tokens,
                cached_tokens=engine.cached_tokens(blocks),
            )
        except KvFetchError as failure:
            return error(
                500,
                f"KV load failed (kv_load_failure_policy=fail): {failure}",
                "InternalServerError",
            )
    room = body.get("bootstrap_room")
    if room is not None:
        key = f"room-{room}"
        if config.role == "prefill":
            internal_id, remote_decode = key, True
            engine.lender.expect(key)
        elif config.role == "decode":
            host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
            if not isinstance(host, str) or not isinstance(port, int):
                return error(
                    400, "bootstrap_host and bootstrap_port are required with bootstrap_room"
                )
            try:
                await engine.wait_remote_kv(host, port, key, prompt_tokens)
            except KvFetchError as failure:
                return error(500, f"KV transfer failed: {failure}", "InternalServerError")
            remote_prefill = True
    span.set_attributes(
        {
            "gen_ai.request.id": request_id,
            "gen_ai.usage.prompt_tokens": prompt_tokens,
            "disagg.cached_tokens": engine.cached_tokens(blocks) if blocks else 0,
            "disagg.kv_from_remote": remote_prefill,
            "disagg.kv_lent": remote_decode,
        }
    )
    sim = SimRequest(
        id=internal_id,
        prompt_tokens=prompt_tokens,
        max_tokens=1 if remote_decode else max_tokens,
        kv_ready=remote_prefill,
        hold_kv=remote_decode,
        block_hashes=blocks,
    )
    if sim.kv_reservation > engine.scheduler.kv_capacity:
        return error(
            400,
            f"this request needs {sim.kv_reservation} tokens of KV cache; the engine "
            f"holds {engine.scheduler.kv_capacity} (prompt plus max_tokens is too long)",
        )
    async with contextlib.aclosing(engine.run(sim, arrival)) as tokens:
        response = await _respond(
            request,
            kind,
            body,
            engine,
            sim,
            tokens,
            request_id,
            internal_id,
            prompt_tokens,
            remote_decode,
        )
    if sim.finished and not remote_decode:
        engine.cache_answer(body, request_id, sim.generated)
    return response


async def _respond(
    request: web.Request,
    kind: str,
    body: dict[str, Any],
    engine: Engine,
    sim: SimRequest,
    tokens: Any,
    request_id: str,
    internal_id: str,
    prompt_tokens: int,
    remote_decode: bool,
) -> web.StreamResponse:
    config = engine.config
    stream = bool(body.get("stream")) and not remote_decode
    model = config.served_model_name
    if not stream:
        text = "".join([output_token(request_id, i) async for i, _ in _indexed(tokens)])
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sim.generated,
            "total_tokens": prompt_tokens + sim.generated,
        }
        payload = full_answer(kind, internal_id, model, text, usage)
        if remote_decode:
            payload["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": engine.block_ids(prompt_tokens),
                "remote_engine_id": config.engine_id,
                "remote_request_id": internal_id,
                "remote_host": config.advertise_host,
                "remote_port": engine.kv_port,
                "tp_size": config.shape.tp,
                "remote_num_tokens": prompt_tokens,
                "transfer_mode": "pull",
            }
        return web.json_response(payload, headers={"X-Request-Id": request_id})
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": request_id,
        }
    )
    await response.prepare(request)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    async for index, _ in _indexed(tokens):
        finish = "length" if index == sim.max_tokens - 1 else None
        chunk = stream_chunk(
            kind, internal_id, model, output_token(request_id, index), finish, index == 0
        )
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    if include_usage:
        usage_chunk: dict[str, Any] = {
            "id": internal_id,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": sim.generated,
                "total_tokens": prompt_tokens + sim.generated,
            },
        }
        await response.write(f"data: {json.dumps(usage_chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _indexed(tokens: Any) -> Any:
    index = 0
    async for emitted in tokens:
        yield index, emitted
        index += 1


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def models(request: web.Request) -> web.Response:
    name = request.app[ENGINE_KEY].config.served_model_name
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": name,
                }
            ],
        }
    )


async def health(_: web.Request) -> web.Response:
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ENGINE_KEY].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def get_faults(request: web.Request) -> web.Response:
    faults = request.app[ENGINE_KEY].faults
    return web.json_response(vars(faults))


async def set_faults(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        update = await request.json()
    except json.JSONDecodeError:
        return error(400, "the request body is not valid JSON")
    allowed = set(vars(engine.faults))
    unknown = set(update) - allowed if isinstance(update, dict) else {"<body>"}
    if unknown:
        names, known = ", ".join(sorted(unknown)), ", ".join(sorted(allowed))
        return error(400, f"unknown fault setting(s): {names}; known: {known}")
    for key, value in update.items():
        setattr(engine.faults, key, value)
    return web.json_response(vars(engine.faults))


async def recent_requests(request: web.Request) -> web.Response:
    """The last requests this engine received, as sent (for tests and debugging)."""
    return web.json_response(list(request.app[ENGINE_KEY].recent))


async def state(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    s = engine.scheduler
    return web.json_response(
        {
            "role": engine.config.role,
            "running": len(s.running),
            "waiting": len(s.waiting),
            "kv_usage": s.usage,
            "kv_leased_requests": engine.lender.leased,
            "kv_expired": engine.lender.expired,
            "accepted": engine.accepted,
        }
    )


def build_app(engine: Engine, max_body_bytes: int = 8 * 1024 * 1024) -> web.Application:
    """The aiohttp application of one simulated engine."""
    app = web.Application(client_max_size=max_body_bytes)
    app[ENGINE_KEY] = engine
    app.add_routes(
        [
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat),
            web.get("/v1/models", models),
            web.get("/health", health),
            web.get("/metrics", metrics),
            web.get("/admin/faults", get_faults),
            web.post("/admin/faults", set_faults),
            web.get("/admin/state", state),
            web.get("/admin/requests", recent_requests),
        ]
    )
    return app
