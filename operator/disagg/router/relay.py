"""Copying the decode engine's answer to the client, and measuring what the client sees.

A non-streamed answer, or one that breaks off before anything reached the client, raises
:class:`UpstreamError` so the caller can retry on another engine; once bytes have streamed,
an upstream failure ends the stream with an error event (tokens are never repeated).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from disagg.router.metrics import RouterMetrics


class UpstreamError(Exception):
    """An engine failed before the client saw anything: safe to retry elsewhere."""


_PIECE = re.compile(rb'"(?:content|text)": ?("[^"\\]*(?:\\.[^"\\]*)*")')
"""A streamed chunk's generated text (a chat delta's content or a completion's text)."""
_DONE = b"data: [DONE]\n\n"
MAX_ANSWER_BYTES = 512 * 1024
"""Of a stream, what is kept to read the answer from; a longer one is not recorded."""


class Answer:
    """The generated text of an answer as it passes through (for cache-aware routing: the
    engine caches it too, and the next turn of a conversation starts with it). A stream's
    bytes are kept and read once at the end, by pattern: the relay's per-token work stays a
    list append."""

    def __init__(self) -> None:
        self._chunks: list[bytes] | None = []
        self._size = 0
        self._tail = b""
        self._text: str | None = None
        self.complete = False

    @property
    def text(self) -> str | None:
        if not self.complete:
            return None
        if self._text is None and self._chunks is not None:
            literals = [m.group(1) for m in _PIECE.finditer(b"".join(self._chunks))]
            try:
                self._text = "".join(
                    json.loads(s) if b"\\" in s else s[1:-1].decode() for s in literals
                )
            except ValueError:
                self.complete = False
                return None
            finally:
                self._chunks = None
        return self._text

    def whole(self, body: bytes) -> None:
        """A non-streamed answer."""
        self._chunks = None
        with contextlib.suppress(ValueError, AttributeError, IndexError, TypeError, KeyError):
            choice = json.loads(body)["choices"][0]
            text = choice.get("text") if "text" in choice else choice["message"]["content"]
            if isinstance(text, str):
                self._text, self.complete = text, True

    def feed(self, data: bytes) -> None:
        """Part of a stream of server-sent events."""
        if self._chunks is None:
            return
        self._size += len(data)
        if self._size > MAX_ANSWER_BYTES:
            self._chunks = None
            return
        self._chunks.append(data)
        self._tail = (self._tail + data)[-len(_DONE) :]
        self.complete = self._tail == _DONE


async def relay(
    request: web.Request,
    metrics: RouterMetrics,
    upstream: aiohttp.ClientResponse,
    stream: bool,
    route: str,
    request_id: str,
    arrival: float,
    answer: Answer | None = None,
    first_token: Callable[[], None] = lambda: None,
) -> web.StreamResponse:
    """Copy the decode engine's answer to the client, measuring what the user sees (and,
    given an :class:`Answer`, keeping its text); ``first_token`` is called when the first
    token arrives (for an answer that is not streamed, when all of it has)."""
    headers = {"X-Request-Id": request_id, "X-Disagg-Path": route}
    if not stream or upstream.status != 200:
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as failure:  # nothing sent yet: retry
            raise UpstreamError(f"the answer broke off: {failure!r}") from failure
        metrics.ttft.observe(time.monotonic() - arrival)
        first_token()
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
                    first_token()
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
