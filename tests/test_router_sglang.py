"""The router's SGLang pairing against in-process engines: a prefill engine that refuses or
cannot be reached ends the pair at once, instead of leaving decode to wait for KV that
never comes (the decode call is cancelled, so the engine aborts it)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from disagg.router.app import build_app
from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.metrics import RouterMetrics
from disagg.router.state import Router, RouterConfig

BODY = {"model": "m", "prompt": "x" * 4000, "max_tokens": 4}


@dataclass
class WaitingDecode:
    """A decode engine that waits for KV until its client goes away."""

    received: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.received.set()
        try:
            await asyncio.Event().wait()  # the KV never arrives
        except asyncio.CancelledError:  # the router hung up: aiohttp cancels the handler
            self.aborted.set()
            raise
        return web.Response(status=500)


def _app(handler: object) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)  # type: ignore[arg-type]
    return app


def _refusing(decode: WaitingDecode) -> object:
    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        await decode.received.wait()  # decode is already waiting for this request's KV
        message = {"error": {"message": "prompt too long for this engine"}}
        return web.json_response(message, status=400)

    return refuse


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def decode() -> AsyncIterator[tuple[WaitingDecode, TestServer]]:
    engine = WaitingDecode()
    server = TestServer(_app(engine.handle), handler_cancellation=True)
    await server.start_server()
    yield engine, server
    await server.close()


async def _router(
    prefill_urls: list[str], decode_url: str
) -> TestClient[web.Request, web.Application]:
    prefill, decode = Pool("prefill"), Pool("decode")
    prefill.replace(Endpoint(u, bootstrap_port=5600) for u in prefill_urls)
    decode.replace([Endpoint(decode_url)])
    config = RouterConfig(served_model_name="m", backend="sglang", decode_read_timeout=60)
    router = Router(config, prefill, decode, Picker("least-outstanding"), RouterMetrics())
    client = TestClient(TestServer(build_app(router)))
    await client.start_server()
    return client


async def test_a_prefill_refusal_is_the_answer_and_decode_stops_waiting(
    decode: tuple[WaitingDecode, TestServer],
) -> None:
    engine, decode_server = decode
    prefill_server = TestServer(_app(_refusing(engine)))
    await prefill_server.start_server()
    client = await _router([str(prefill_server.make_url(""))], str(decode_server.make_url("")))
    try:
        started = time.monotonic()
        response = await client.post("/v1/completions", json=BODY)
        assert response.status == 400
        assert "too long for this engine" in await response.text()
        assert time.monotonic() - started < 10  # not the 60 s decode read timeout
        await asyncio.wait_for(engine.aborted.wait(), 5)
    finally:
        await client.close()
        await prefill_server.close()


async def test_an_unreachable_prefill_engine_fails_the_pair_fast_and_aborts_decode(
    decode: tuple[WaitingDecode, TestServer],
) -> None:
    engine, decode_server = decode
    client = await _router([_closed_port()], str(decode_server.make_url("")))
    try:
        started = time.monotonic()
        response = await client.post("/v1/completions", json=BODY)
        assert response.status == 503
        assert time.monotonic() - started < 10
        if engine.received.is_set():  # the decode call may not have arrived before its cancel
            await asyncio.wait_for(engine.aborted.wait(), 5)
        metrics = await (await client.get("/metrics")).text()
        assert 'disagg_router_upstream_failures_total{role="prefill"} 1.0' in metrics
    finally:
        await client.close()
