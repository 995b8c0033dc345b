"""The simulated KV side channel: a prefill engine lends prompt KV, a decode engine fetches it.

Real bytes cross a real TCP connection (sized by the model's KV bytes per token, scaled down
by a factor so tests stay small). The protocol is one line each way:
``GET <request id> <cached tokens>`` answered by ``OK <nbytes>`` plus the bytes of the
tokens after the ones the decode side already holds in its prefix cache (vLLM's NIXL
connector reads only the blocks it has not computed; a full hit reads none and only releases
the lease), or ``ERR <reason>`` when the lease expired or never existed, which the decode
side reports as a failed KV load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

CHUNK: Final = 64 * 1024
CONNECT_TIMEOUT: Final = 5.0


class KvFetchError(RuntimeError):
    """The decode side could not load the prompt KV from the prefill side."""


class KvPending(KvFetchError):
    """The prefill side knows the request but has not finished its prompt yet (SGLang)."""


class KvUnknown(KvFetchError):
    """The prefill side holds no lease for the request: expired, or not arrived yet."""


@dataclass
class Lease:
    tokens: int
    nbytes: int
    expires_at: float


class KvLender:
    """Prefill side: holds leases and serves them over TCP until fetched or expired."""

    def __init__(self, lease_seconds: float, on_release: Callable[[int], None]) -> None:
        self._leases: dict[str, Lease] = {}
        self._lease_seconds = lease_seconds
        self._on_release = on_release
        self._server: asyncio.Server | None = None
        self._pending: set[str] = set()
        self.expired = 0

    def expect(self, request_id: str) -> None:
        """A prompt for this id is being computed (SGLang's decode may ask before it is done)."""
        self._pending.add(request_id)

    def forget(self, request_id: str) -> None:
        self._pending.discard(request_id)

    def lend(self, request_id: str, tokens: int, nbytes: int) -> None:
        self._pending.discard(request_id)
        self._leases[request_id] = Lease(tokens, nbytes, time.monotonic() + self._lease_seconds)

    @property
    def leased(self) -> int:
        self.expire()
        return len(self._leases)

    def expire(self) -> None:
        now = time.monotonic()
        for request_id, lease in list(self._leases.items()):
            if lease.expires_at <= now:
                del self._leases[request_id]
                self.expired += 1
                self._on_release(lease.tokens)

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        sock = self._server.sockets[0]
        bound: int = sock.getsockname()[1]
        return bound

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
            verb, _, rest = line.partition(" ")
            request_id, _, cached = rest.rpartition(" ")  # ids may hold spaces; counts not
            self.expire()
            lease = self._leases.pop(request_id, None) if verb == "GET" else None
            if lease is None and request_id in self._pending:
                writer.write(b"ERR pending\n")
            elif lease is None:
                writer.write(b"ERR expired or unknown request\n")
            else:
                remaining = _uncached_bytes(lease, cached)
                writer.write(f"OK {remaining}\n".encode())
                block = b"\x5a" * CHUNK
                while remaining > 0:
                    n = min(CHUNK, remaining)
                    writer.write(block[:n])
                    await writer.drain()
                    remaining -= n
                self._on_release(lease.tokens)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _uncached_bytes(lease: Lease, cached: str) -> int:
    """The lease's bytes after the first ``cached`` tokens (a malformed count reads as 0)."""
    held = int(cached) if cached.isdigit() else 0
    if lease.tokens <= 0 or held <= 0:
        return lease.nbytes
    return lease.nbytes * max(0, lease.tokens - held) // lease.tokens


async def fetch(
    host: str, port: int, request_id: str, read_timeout: float, cached_tokens: int = 0
) -> int:
    """Pull a lent KV cache, less its first ``cached_tokens`` tokens; returns the bytes
    received or raises KvFetchError."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), CONNECT_TIMEOUT
        )
    except (OSError, TimeoutError) as error:
        raise KvFetchError(f"cannot reach the prefill KV channel {host}:{port}: {error}") from error
    try:
        writer.write(f"GET {request_id} {max(0, cached_tokens)}\n".encode())
        await writer.drain()
        header = (await asyncio.wait_for(reader.readline(), read_timeout)).decode().strip()
        if header == "ERR pending":
            raise KvPending(f"prefill engine {host}:{port} has not finished {request_id}")
        if header == "ERR expired or unknown request":
            raise KvUnknown(f"prefill engine {host}:{port} holds no KV for {request_id}")
        if not header.startswith("OK "):
            raise KvFetchError(
                f"prefill engine {host}:{port} refused the KV: {header.removeprefix('ERR ')}"
            )
        expected = int(header.split()[1])
        received = 0
        while received < expected:
            data = await asyncio.wait_for(
                reader.read(min(CHUNK, expected - received)), read_timeout
            )
            if not data:
                raise KvFetchError(
                    f"KV transfer from {host}:{port} ended after {received}/{expected} bytes"
                )
            received += len(data)
        return received
    except (TimeoutError, ConnectionError) as error:
        raise KvFetchError(f"KV transfer from {host}:{port} failed: {error!r}") from error
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
