"""The router's request path: prefill, then decode, streamed back unchanged.

Failure handling, in the order a request meets it:

* a prefill error or timeout is retried once on another prefill engine, then the request is
  served decode-only (the decode engine computes the prompt itself: path ``fallback``);
* a decode failure before any byte reached the client is retried on another decode engine;
  if the KV cannot be loaded there either, the request falls back to decode-only;
* after bytes have streamed, an upstream failure ends the stream with an error event; tokens
  are never repeated;
* a client that disconnects cancels the upstream request (aiohttp cancels the handler).

While the prefill pool is backed up, a short prompt may skip it: a decode engine with room
prefills it itself (path ``offloaded``, :mod:`disagg.routing.offload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from disagg.router import protocol, tracing
from disagg.router.endpoints import Endpoint
from disagg.router.relay import Answer, UpstreamError, relay
from disagg.router.sglang import handle_sglang
from disagg.router.state import (
    RETRIABLE_CLIENT_ERRORS,
    ROUTER_KEY,
    Call,
    EngineRejected,
    Router,
    error_response,
    note_failure,
    open_decode,
    record_outcome,
)
from disagg.routing.affinity import decode_alone
from disagg.routing.offload import slot
from disagg.routing.tokens import continuation, estimate_tokens

log = logging.getLogger("disagg.router")
PASSED_HEADERS = ("Authorization", "X-Request-Id")


def _prompt_prefix(body: dict[str, Any]) -> str:
    if isinstance(body.get("messages"), list):
        return json.dumps(body["messages"][:2])[:512]
    return str(body.get("prompt", ""))[:512]


async def _prefill(router: Router, call: Call) -> dict[str, Any] | None:
    """Run the prefill step on up to two engines; the returned kv_transfer_params, or None."""
    assert router.session is not None
    tried: set[str] = set()
    for _ in range(2):
        work = {url: float(router.backlog.in_flight(url)) for url in router.prefill.endpoints}
        endpoint = router.picker.pick(router.prefill, call.prefix, tried, call.prompt, work)
        if endpoint is None:
            return None
        tried.add(endpoint.url)
        started = time.monotonic()
        tokens, served = _prompt_tokens(call), False
        router.backlog.sent(endpoint.url, tokens, started)
        with (
            router.metrics.track(endpoint, "prefill"),
            tracing.leg("prefill", endpoint.url) as span,
        ):
            try:
                timeout = aiohttp.ClientTimeout(total=router.config.prefill_timeout)
                async with router.session.post(
                    endpoint.url + call.path,
                    json=protocol.prefill_request(call.body),
                    headers=tracing.outgoing(call.headers),
                    timeout=timeout,
                ) as response:
                    raw = await response.read()
                    ctype = response.headers.get("Content-Type", "application/json")
                    if 400 <= response.status < 500 and (
                        response.status not in RETRIABLE_CLIENT_ERRORS
                    ):
                        raise EngineRejected(response.status, raw, ctype)
                    if response.status != 200:
                        raise UpstreamError(f"HTTP {response.status}: {raw[:200]!r}")
                    payload = json.loads(raw)
                params = payload.get("kv_transfer_params") if isinstance(payload, dict) else None
                if not isinstance(params, dict):
                    raise UpstreamError("the prefill response carries no kv_transfer_params")
                router.metrics.prefill_seconds.observe(time.monotonic() - started)
                router.picker.note(router.prefill, endpoint, call.prompt)
                served = True
                return params
            except (aiohttp.ClientError, TimeoutError, UpstreamError, ValueError) as failure:
                tracing.failed(span, failure)
                note_failure(endpoint, failure)
                router.metrics.upstream_failures.labels(role="prefill").inc()
                log.warning(
                    "Prefill on %s failed for %s: %r",
                    endpoint.url,
                    call.request_id,
                    failure,
                )
            finally:
                router.backlog.finished(endpoint.url, tokens, time.monotonic(), served)
    return None


def _prompt_tokens(call: Call) -> int:
    return call.prompt.tokens if call.prompt is not None else estimate_tokens(call.body)


def _offload_target(router: Router, call: Call) -> Endpoint | None:
    """The decode engine that prefills this prompt itself because the prefill pool is
    backed up (:mod:`disagg.routing.offload`), or None."""
    rule = router.config.offload
    if rule is None:
        return None
    prefill = [e.url for e in router.prefill.available()]
    router.backlog.forget(set(router.prefill.endpoints))
    wait = router.backlog.least_wait(prefill, time.monotonic())
    decode = router.decode.available()
    return rule.target(_prompt_tokens(call), wait, decode, lambda e: (e.in_flight, e.url))


def _warn_decode(endpoint: Endpoint, call: Call, failure: BaseException) -> None:
    log.warning("Decode on %s failed for %s: %r", endpoint.url, call.request_id, failure)


def _note_answer(router: Router, endpoint: Endpoint, call: Call, text: str) -> None:
    """The decode engine caches what it generated too: a follow-up turn starts with it."""
    follow_up = continuation(call.body, text)
    if follow_up is not None:
        router.picker.note(router.decode, endpoint, router.prompts.read(follow_up))


async def _decode(
    request: web.Request,
    router: Router,
    call: Call,
    kv_params: dict[str, Any] | None,
    route: str,
    preferred: Endpoint | None = None,
) -> web.StreamResponse:
    """Serve the request on a decode engine (``preferred`` first), retrying others. An
    offloaded prompt counts against its engine's local prefills until its first token."""
    tried: set[str] = set()
    attempts: list[dict[str, Any] | None] = [kv_params, kv_params, kv_params]
    if kv_params is not None:
        attempts.append(None)  # last resort: the decode engine prefills itself
    for params in attempts:
        endpoint = preferred if preferred is not None and not tried else None
        if endpoint is None or endpoint not in router.decode.available():
            endpoint = router.picker.pick(router.decode, call.prefix, tried, call.prompt)
        if endpoint is None:
            if tried:
                tried.clear()  # every engine failed once; the fallback may retry any of them
                endpoint = router.picker.pick(router.decode, call.prefix, tried, call.prompt)
            if endpoint is None:
                break
        tried.add(endpoint.url)
        if params is None and kv_params is not None:
            route = "fallback"
        handoff = tracing.handoff(call.span, params) if params is not None else None
        with (
            router.metrics.track(endpoint, "decode"),
            _local_prefill(endpoint, route) as done,
            tracing.leg(
                "decode", endpoint.url, **{"disagg.kv_handed_over": handoff is not None}
            ) as span,
            tracing.until_first_token(call.span, call.arrival, handoff, done) as first_token,
        ):
            try:
                upstream = await open_decode(
                    router,
                    endpoint,
                    call.path,
                    protocol.decode_request(call.body, params),
                    tracing.outgoing(call.headers),
                )
            except (aiohttp.ClientError, TimeoutError, UpstreamError) as failure:
                tracing.failed(span, failure)
                note_failure(endpoint, failure)
                router.metrics.upstream_failures.labels(role="decode").inc()
                _warn_decode(endpoint, call, failure)
                continue
            router.picker.note(router.decode, endpoint, call.prompt)
            answer = Answer() if call.prompt is not None else None
            try:
                response = await relay(
                    request,
                    router.metrics,
                    upstream,
                    bool(call.body.get("stream")),
                    route,
                    call.request_id,
                    call.arrival,
                    answer,
                    first_token,
                )
            except UpstreamError as failure:
                tracing.failed(span, failure)
                router.metrics.upstream_failures.labels(role="decode").inc()
                _warn_decode(endpoint, call, failure)
                continue
            finally:
                upstream.release()
        if answer is not None and answer.text is not None:
            _note_answer(router, endpoint, call, answer.text)
        record_outcome(router, call, route, response.status, endpoint)
        return response
    record_outcome(router, call, route, 503)
    return error_response(
        503, "no decode engine could serve the request", "ServiceUnavailableError"
    )


def _local_prefill(
    endpoint: Endpoint, route: str
) -> contextlib.AbstractContextManager[Callable[[], None]]:
    """An offloaded prompt holds one of its engine's offload slots until its first token."""
    return slot(endpoint) if route == "offloaded" else contextlib.nullcontext(lambda: None)


async def _serve_vllm(request: web.Request, router: Router, call: Call) -> web.StreamResponse:
    """Decode alone when the chosen decode engine can (a short prompt, or one it mostly
    holds already), else prefill first and hand the KV over."""
    config, picker = router.config, router.picker
    preferred, route = None, None
    if call.prompt is not None:
        preferred = picker.pick(router.decode, call.prefix, None, call.prompt)
        held = picker.held(router.decode, preferred, call.prompt) if preferred else 0
        call.span.set_attribute("disagg.cached_tokens", held * router.prompts.block_size)
        route = decode_alone(
            call.prompt, held, router.prompts.block_size, config.pd_threshold, config.local_prefill
        )
        if not held:
            preferred = None  # no affinity: pick decode after prefill, on fresher load
    elif estimate_tokens(call.body) < config.pd_threshold:
        route = "skipped"
    kv_params = None
    if route is None and router.prefill.available():
        target = _offload_target(router, call)
        if target is not None:
            return await _decode(request, router, call, None, "offloaded", target)
    if route is None:
        # A prompt long enough for prefill that decode serves alone is a fallback, whether
        # the prefill failed or no prefill engine is there to try: both mean an outage.
        route = "fallback"
        if router.prefill.available():
            try:
                kv_params = await _prefill(router, call)
            except EngineRejected as rejected:
                record_outcome(router, call, "rejected", rejected.status)
                return rejected.response({"X-Request-Id": call.request_id})
            if kv_params is not None:
                route = "disaggregated"
    return await _decode(request, router, call, kv_params, route, preferred)


async def handle(request: web.Request, kind: str, path: str) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    arrival = time.monotonic()
    try:
        async with asyncio.timeout(router.config.body_timeout):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"the request body exceeds {router.config.max_body_bytes} bytes")
    except TimeoutError:
        router.metrics.client_timeouts.labels(phase="body").inc()
        return error_response(
            408, f"the request body took longer than {router.config.body_timeout:g}s to arrive"
        )
    body, unreadable = protocol.parse_body(raw, request.charset)
    if unreadable is not None:
        return error_response(*unreadable)
    problem = protocol.validate(body, kind, router.config.served_model_name)
    if problem is not None:
        status, message = problem
        return error_response(
            status, message, "NotFoundError" if status == 404 else "BadRequestError"
        )
    assert isinstance(body, dict)  # validate refuses anything else
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    headers = {k: request.headers[k] for k in PASSED_HEADERS if k in request.headers}
    headers["X-Request-Id"] = request_id
    prompt = router.prompts.read(body) if router.picker.cache_aware else None
    with tracing.TRACER.start_as_current_span(
        f"POST {path}",
        context=tracing.incoming(request.headers),
        kind=tracing.SpanKind.SERVER,
        attributes={
            "disagg.model": str(body.get("model", "")),
            "disagg.request_id": request_id,
            "disagg.prompt_tokens": prompt.tokens if prompt else estimate_tokens(body),
            "disagg.stream": bool(body.get("stream")),
        },
    ) as span:
        call = Call(
            path, body, headers, request_id, arrival, _prompt_prefix(body), prompt, span=span
        )
        if router.config.colocated:
            preferred = router.picker.pick(router.decode, call.prefix, None, call.prompt)
            return await _decode(request, router, call, None, "colocated", preferred)
        if router.config.backend == "sglang":
            return await handle_sglang(request, router, call)
        return await _serve_vllm(request, router, call)


async def completions(request: web.Request) -> web.StreamResponse:
    return await handle(request, "completion", "/v1/completions")


async def chat(request: web.Request) -> web.StreamResponse:
    return await handle(request, "chat", "/v1/chat/completions")


__all__ = ["chat", "completions", "handle"]
