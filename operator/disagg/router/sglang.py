"""SGLang's P/D protocol: the same request, with bootstrap fields, to both engines at once.

The decode engine waits for the KV from the prefill engine's bootstrap server (host, port,
room), so the decode response is what the client gets; the prefill response is drained and
discarded. SGLang decode engines cannot prefill by themselves, so there is no decode-only
fallback: a failed pair is retried once with another prefill engine, then the request fails.

The two calls race: a prefill engine that fails or refuses the request before decode has
answered ends the pair at once (the decode call is cancelled, which aborts it), since
decode would otherwise wait for KV that never comes until its read timeout. A refusal (a 4xx
other than 408/429) is the client's mistake: it is answered as the engine said, not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
from aiohttp import web

from disagg.router import protocol, tracing
from disagg.router.relay import UpstreamError, relay
from disagg.router.state import (
    RETRIABLE_CLIENT_ERRORS,
    Call,
    EngineRejected,
    Router,
    error_response,
    note_failure,
    open_decode,
    record_outcome,
)

log = logging.getLogger("disagg.router.sglang")
DEFAULT_BOOTSTRAP_PORT = 8998


async def _drain_prefill(
    router: Router, url: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    assert router.session is not None
    timeout = aiohttp.ClientTimeout(total=router.config.prefill_timeout)
    with tracing.leg("prefill", url):
        async with router.session.post(
            url, json=body, headers=tracing.outgoing(headers), timeout=timeout
        ) as response:
            raw = await response.read()
            if 400 <= response.status < 500 and response.status not in RETRIABLE_CLIENT_ERRORS:
                ctype = response.headers.get("Content-Type", "application/json")
                raise EngineRejected(response.status, raw, ctype)
            if response.status >= 400:
                raise UpstreamError(f"prefill HTTP {response.status}")


def _failed(task: asyncio.Task[None]) -> bool:
    return not task.cancelled() and task.exception() is not None


async def _decode_unless_prefill_fails(
    prefill: asyncio.Task[None], decode: asyncio.Task[aiohttp.ClientResponse]
) -> aiohttp.ClientResponse:
    """The decode response, unless the prefill call fails first (then its error, and the
    decode call is cancelled)."""
    await asyncio.wait({prefill, decode}, return_when=asyncio.FIRST_COMPLETED)
    if not decode.done() and _failed(prefill):
        decode.cancel()
        with contextlib.suppress(BaseException):
            await decode
        prefill.result()  # raises the prefill's failure
    return await decode


async def handle_sglang(request: web.Request, router: Router, call: Call) -> web.StreamResponse:
    path, body, headers, request_id = call.path, call.body, call.headers, call.request_id
    tried: set[str] = set()
    for _ in range(2):
        prefill = router.picker.pick(router.prefill, call.prefix, tried, call.prompt)
        decode = router.picker.pick(router.decode, call.prefix, None, call.prompt)
        if prefill is None or decode is None:
            break
        router.picker.note(router.prefill, prefill, call.prompt)
        router.picker.note(router.decode, decode, call.prompt)
        tried.add(prefill.url)
        room = router.rng.randint(0, 2**63 - 1)
        paired = protocol.sglang_request(
            body, prefill.host, prefill.bootstrap_port or DEFAULT_BOOTSTRAP_PORT, room
        )
        handoff = tracing.handoff(
            call.span, {"remote_host": prefill.host, "remote_port": paired["bootstrap_port"]}
        )
        prefill_task = asyncio.create_task(
            _drain_prefill(router, prefill.url + path, paired, headers)
        )
        with (
            router.metrics.track(prefill, "prefill"),
            router.metrics.track(decode, "decode"),
            tracing.leg("decode", decode.url, **{"disagg.kv_handed_over": True}) as span,
            tracing.until_first_token(call.span, call.arrival, handoff, lambda: None) as first,
        ):
            decode_task = asyncio.create_task(
                open_decode(router, decode, path, paired, tracing.outgoing(headers))
            )
            try:
                upstream = await _decode_unless_prefill_fails(prefill_task, decode_task)
            except EngineRejected as rejected:
                record_outcome(router, call, "rejected", rejected.status)
                return rejected.response({"X-Request-Id": request_id})
            except (aiohttp.ClientError, TimeoutError, UpstreamError) as failure:
                tracing.failed(span, failure)
                for task in (prefill_task, decode_task):
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                role = "prefill" if prefill_task.done() and _failed(prefill_task) else "decode"
                note_failure(prefill if role == "prefill" else decode, failure)
                router.metrics.upstream_failures.labels(role=role).inc()
                log.warning(
                    "SGLang pair %s -> %s failed for %s: %r",
                    prefill.url,
                    decode.url,
                    request_id,
                    failure,
                )
                continue
            try:
                response = await relay(
                    request,
                    router.metrics,
                    upstream,
                    bool(body.get("stream")),
                    "disaggregated",
                    request_id,
                    call.arrival,
                    first_token=first,
                )
            finally:
                upstream.release()
                if not prefill_task.done():
                    prefill_task.cancel()
                with contextlib.suppress(BaseException):
                    await prefill_task
        record_outcome(router, call, "disaggregated", response.status, decode)
        return response
    record_outcome(router, call, "disaggregated", 503)
    return error_response(
        503, "no prefill/decode pair could serve the request", "ServiceUnavailableError"
    )
