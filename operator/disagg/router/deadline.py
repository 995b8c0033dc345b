"""A deadline for a client connection's first request headers (slow-loris protection).

The router bounds the rest of a client's time: the body by ``--body-timeout`` (it reads it
under a timeout), an idle keep-alive connection by ``--idle-timeout`` (aiohttp's keep-alive
timer, restarted after each response). What aiohttp leaves open is a connection that never
completes its first request line and headers: one byte every few seconds holds it (aiohttp
3.14 closes it at the keep-alive timeout, older releases never). A few hundred such
connections exhaust file descriptors. :class:`HeaderDeadline` closes any connection whose
first request has not arrived ``--header-timeout`` seconds after it opened.

It sees requests through a middleware (``request.protocol`` is the connection) and the open
connections through ``web.Server.connections``; the decision (:meth:`overdue`) is pure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, Protocol

from aiohttp import web

log = logging.getLogger("disagg.router")
SWEEP_SECONDS: Final = 0.5


class Connection(Protocol):
    """What the deadline needs of an aiohttp RequestHandler."""

    def force_close(self) -> None: ...

    def __hash__(self) -> int: ...


class HeaderDeadline:
    """Closes connections whose first request headers are late."""

    def __init__(self, timeout: float, on_close: Callable[[], None] = lambda: None) -> None:
        self.timeout = timeout
        self.on_close = on_close
        # aiohttp's connections take no weak references: entries go when a sweep no longer
        # sees the connection open.
        self._opened: dict[Connection, float] = {}
        self._served: set[Connection] = set()

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.saw_request(request.protocol)
        return await handler(request)

    def saw_request(self, connection: Connection) -> None:
        """A complete request line and headers arrived on ``connection``."""
        self._served.add(connection)

    def overdue(self, connections: Iterable[Connection], now: float) -> list[Connection]:
        """The connections open longer than the deadline without a first request (a
        connection is first seen at the sweep after it opened: up to SWEEP_SECONDS late)."""
        current = set(connections)
        self._served &= current
        self._opened = {c: t for c, t in self._opened.items() if c in current}
        late = []
        for connection in current - self._served:
            opened = self._opened.setdefault(connection, now)
            if now - opened > self.timeout:
                late.append(connection)
        return late

    async def enforce(self, connections: Callable[[], Iterable[Connection]]) -> None:
        """Sweep the open ``connections()`` until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            late = self.overdue(connections(), loop.time())
            for connection in late:
                connection.force_close()
                self.on_close()
            if late:
                log.info(
                    "Closed %d client connection(s) that sent no complete request headers "
                    "within %gs",
                    len(late),
                    self.timeout,
                )
