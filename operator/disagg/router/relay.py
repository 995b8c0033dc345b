"""Copying the decode engine's answer to the client, and measuring what the client sees.

A non-streamed answer, or one that breaks off before anything reached the client, raises
:class:`UpstreamError` so the caller can retry on another engine; once bytes have streamed,
an upstream failure ends the stream with an error event (tokens are never repeated).
"""

from __future__ import annotations

import json
import time

import aiohttp
from aiohttp import web

from disagg.router.metrics import RouterMetrics


class UpstreamError(Exception):
    """An engine failed before the client saw anything: safe to retry elsewhere."""


async def relay(
    request: web.Request,
    metrics: RouterMetrics,
    upstream: aiohttp.ClientResponse,
    stream: bool,
    route: str,
    request_id: str,
    arrival: float,
) -> web.StreamResponse:
    """Copy the decode engine's answer to the client, measuring what the user sees."""
    headers = {"X-Request-Id": request_id, "X-Disagg-Path": route}
    if not stream or upstream.status != 200:
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as failure:  # nothing sent yet: retry
            raise UpstreamError(f"the answer broke off: {failure!r}") from failure
        metrics.ttft.observe(time.monotonic() - arrival)
        ctype = upstream.headers.get("Content-Type", "application/json")
        return web.Response(
            body=body, status=upstream.status, headers={**headers, "Content-Type": ctype}
        )
    response = web.StreamResponse(
        status=200,
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    await response.prepare(request)
    last: float | None = None
    try:
        async for data in upstream.content.iter_any():
            now = time.monotonic()
            events = data.count(b"data: {")
            if events:
                if last is None:
                    metrics.ttft.observe(now - arrival)
                    events -= 1
                else:
                    for _ in range(events):
                        metrics.itl.observe((now - last) / events)
                last = now
            await response.write(data)
    except (aiohttp.ClientError, TimeoutError) as failure:
        metrics.upstream_failures.labels(role="decode").inc()
        message = {
            "error": {
                "message": f"the decode engine failed mid-stream: {failure!r}",
                "type": "InternalServerError",
                "param": None,
                "code": 502,
            }
        }
        await response.write(f"data: {json.dumps(message)}\n\ndata: [DONE]\n\n".encode())
    await response.write_eof()
    return response
