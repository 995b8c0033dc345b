"""Copying the decode engine's answer to the client, and measuring what the client sees.

A non-streamed answer, or one that breaks off before anything reached the client, raises
:class:`UpstreamError` so the caller can retry on another engine; once bytes have streamed,
an upstream failure ends the stream with an error event (tokens are never repeated).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from disagg.router.metrics import RouterMetrics


class UpstreamError(Exception):
    """An engine failed before the client saw anything: safe to retry elsewhere."""


class Answer:
    """The generated text of an answer as it passes through (for cache-aware routing: the
    engine caches it too, and the next turn of a conversation starts with it)."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._pending = b""
        self.complete = False

    @property
    def text(self) -> str | None:
        return "".join(self._pieces) if self.complete else None

    def _add(self, payload: Any) -> None:
        for choice in payload.get("choices") or () if isinstance(payload, dict) else ():
            if isinstance(choice, dict):
                piece = choice.get("text")
                if piece is None:
                    piece = (choice.get("delta") or choice.get("message") or {}).get("content")
                if isinstance(piece, str):
                    self._pieces.append(piece)

    def whole(self, body: bytes) -> None:
        with contextlib.suppress(ValueError):
            self._add(json.loads(body))
            self.complete = True

    def feed(self, data: bytes) -> None:
        *events, self._pending = (self._pending + data).split(b"\n\n")
        for event in events:
            payload = event.strip().removeprefix(b"data: ")
            if payload == b"[DONE]":
                self.complete = True
            elif payload.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    self._add(json.loads(payload))


async def relay(
    request: web.Request,
    metrics: RouterMetrics,
    upstream: aiohttp.ClientResponse,
    stream: bool,
    route: str,
    request_id: str,
    arrival: float,
    answer: Answer | None = None,
) -> web.StreamResponse:
    """Copy the decode engine's answer to the client, measuring what the user sees (and,
    given an :class:`Answer`, keeping its text)."""
    headers = {"X-Request-Id": request_id, "X-Disagg-Path": route}
    if not stream or upstream.status != 200:
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as failure:  # nothing sent yet: retry
            raise UpstreamError(f"the answer broke off: {failure!r}") from failure
        metrics.ttft.observe(time.monotonic() - arrival)
        if answer is not None and upstream.status == 200:
            answer.whole(body)
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
            if answer is not None:
                answer.feed(data)
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
        if answer is not None:
            answer.complete = False
    await response.write_eof()
    return response
