"""The router's shared state and what both request paths (vLLM's in :mod:`disagg.router.proxy`,
SGLang's in :mod:`disagg.router.sglang`) use: its configuration, the Router the handlers
share, one client call, the engine's own refusals and our error answers, opening a decode
stream, and skipping an engine that refuses connections for a moment."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.trace import INVALID_SPAN, Span

from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.metrics import RouterMetrics
from disagg.router.prompt_blocks import CharacterReader, PromptReader
from disagg.router.relay import UpstreamError
from disagg.routing.affinity import LocalPrefill
from disagg.routing.offload import Offload, PrefillBacklog
from disagg.routing.prompt import Prompt

UNREACHABLE_SECONDS = 2.0


def note_failure(endpoint: Endpoint, failure: BaseException) -> None:
    """An engine that refuses connections is skipped for a moment (it may still be starting)."""
    if isinstance(failure, aiohttp.ClientConnectorError):
        endpoint.unreachable_until = time.monotonic() + UNREACHABLE_SECONDS


@dataclass
class RouterConfig:
    """Behaviour of one router process."""

    served_model_name: str | None
    colocated: bool = False
    """One engine pool prefills and decodes: every request goes to a decode engine as sent."""
    pd_threshold: int = 256
    backend: str = "vllm"
    prefill_timeout: float = 60.0
    decode_connect_timeout: float = 10.0
    decode_read_timeout: float = 300.0
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout: float = 30.0
    """Seconds a client may take to send its request body (slow clients are cut off)."""
    max_upstream_connections: int = 1024
    """Open connections to the engines at most; more requests wait for a free one."""
    local_prefill: LocalPrefill | None = field(default_factory=LocalPrefill)
    """Cache-aware routing: when a decode engine prefills a follow-up itself (None: never)."""
    offload: Offload | None = None
    """When a decode engine prefills a short prompt because the prefill pool is backed up
    (None: never)."""


@dataclass
class Router:
    """Shared state of the request handlers."""

    config: RouterConfig
    prefill: Pool
    decode: Pool
    picker: Picker
    metrics: RouterMetrics
    session: aiohttp.ClientSession | None = None
    rng: random.Random = field(default_factory=random.Random)
    prompts: PromptReader = field(default_factory=CharacterReader)
    """How prompts become tokens and blocks (cache-aware routing)."""
    backlog: PrefillBacklog = field(default_factory=PrefillBacklog)
    """Prompt tokens in flight at each prefill engine and how fast it finishes them."""


ROUTER_KEY = web.AppKey("router", Router)


@dataclass(frozen=True)
class Call:
    """One client request as the handlers pass it along."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    """What is forwarded to the engines."""
    request_id: str
    arrival: float
    prefix: str
    """The prompt's start, for prefix affinity."""
    prompt: Prompt | None
    """Token count and block hashes, for cache-aware routing (None under other policies)."""
    span: Span = INVALID_SPAN
    """The request's span (:mod:`disagg.router.tracing`; a no-op one when not traced)."""


def record_outcome(
    router: Router, call: Call, route: str, status: int, decode: Endpoint | None = None
) -> None:
    """Count the request by the path it took and its answer's status, and say both (and the
    decode engine that answered) on its span."""
    router.metrics.requests.labels(path=route, code=str(status)).inc()
    call.span.set_attribute("disagg.path", route)
    call.span.set_attribute("http.response.status_code", status)
    if decode is not None:
        call.span.set_attribute("disagg.decode_engine", decode.url)


class EngineRejected(Exception):
    """The engine refused the request itself (a 4xx other than 408/429): the client's
    mistake, answered as the engine said, not retried and not an engine failure."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(status)
        self.status, self.body, self.content_type = status, body, content_type

    def response(self, headers: dict[str, str]) -> web.Response:
        return web.Response(
            body=self.body,
            status=self.status,
            headers={**headers, "Content-Type": self.content_type},
        )


RETRIABLE_CLIENT_ERRORS = frozenset({408, 429})


def error_response(status: int, message: str, type_: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": status}}
    return web.json_response(body, status=status)


async def open_decode(
    router: Router, endpoint: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str]
) -> aiohttp.ClientResponse:
    assert router.session is not None
    timeout = aiohttp.ClientTimeout(
        sock_connect=router.config.decode_connect_timeout,
        sock_read=router.config.decode_read_timeout,
    )
    response = await router.session.post(
        endpoint.url + path, json=body, headers=headers, timeout=timeout
    )
    if response.status >= 500:
        text = await response.text()
        response.release()
        raise UpstreamError(f"HTTP {response.status}: {text[:200]}")
    return response
