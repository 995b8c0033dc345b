"""The router's HTTP application: the OpenAI routes (served by :mod:`disagg.router.proxy`),
the model list, health (ready while a decode endpoint is up), the pools' view for operators
and tests, the metrics, and the lifetime of the upstream connection pool."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from disagg.router.proxy import chat, completions
from disagg.router.state import ROUTER_KEY, Router


async def models(request: web.Request) -> web.Response:
    name = request.app[ROUTER_KEY].config.served_model_name
    data = [{"id": name, "object": "model", "owned_by": "disagg"}] if name else []
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    if not router.decode.available():
        return web.Response(status=503, text="no decode endpoint")
    return web.Response(text="ok")


async def endpoints(request: web.Request) -> web.Response:
    """The router's view of both pools (for operators and tests)."""
    router = request.app[ROUTER_KEY]
    view: dict[str, Any] = {
        pool.role: router.picker.describe(pool) for pool in (router.prefill, router.decode)
    }
    view["policy"] = router.picker.policy
    if router.picker.cache_aware:
        view["tokenizer"] = router.prompts.description
    if router.config.offload is not None:
        now = time.monotonic()
        for row in view["prefill"]:
            url = str(row["url"])
            row["wait_seconds"] = router.backlog.wait(url, now)
            row["in_flight_tokens"] = router.backlog.in_flight(url)
        for row in view["decode"]:
            row["local_prefills"] = router.decode.endpoints[str(row["url"])].local_prefills
    return web.json_response(view)


async def metrics(request: web.Request) -> web.Response:
    body, ctype = request.app[ROUTER_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": ctype})


def build_app(router: Router, middlewares: Sequence[Middleware] = ()) -> web.Application:
    """The router's aiohttp application."""
    app = web.Application(client_max_size=router.config.max_body_bytes, middlewares=middlewares)
    app[ROUTER_KEY] = router

    async def open_session(app: web.Application) -> Any:
        connector = aiohttp.TCPConnector(
            limit=router.config.max_upstream_connections, limit_per_host=0, ttl_dns_cache=60
        )
        router.session = aiohttp.ClientSession(connector=connector)
        yield
        await router.session.close()

    app.cleanup_ctx.append(open_session)
    app.add_routes([
        web.post("/v1/completions", completions), web.post("/v1/chat/completions", chat),
        web.get("/v1/models", models), web.get("/health", health), web.get("/metrics", metrics),
        web.get("/debug/endpoints", endpoints),
    ])  # fmt: skip
    return app


__all__ = ["build_app"]
