"""Worker endpoints of a pool and how one is picked (pure apart from the random source).

The default is least outstanding requests with power-of-two choices: sample two healthy
endpoints, take the one with fewer requests in flight. Prefix affinity hashes the start of
the prompt onto a stable endpoint so a shared prefix keeps hitting the same prefix cache,
falling back to least-outstanding when that endpoint is much busier than the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

PREFIX_CHARS: Final = 256
AFFINITY_SLACK: Final = 4


@dataclass(eq=False)
class Endpoint:
    """One engine: its base URL and what the router knows about it."""

    url: str
    name: str = ""
    bootstrap_port: int | None = None
    in_flight: int = 0
    draining: bool = False
    unreachable_until: float = 0.0
    """Monotonic time before which the endpoint is skipped (it refused a connection)."""

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].rsplit(":", 1)[0]


@dataclass
class Pool:
    """The live endpoints of one role, updated by discovery."""

    role: str
    endpoints: dict[str, Endpoint] = field(default_factory=dict)

    def replace(self, wanted: Iterable[Endpoint]) -> None:
        """Replace membership; kept endpoints keep their in-flight counts."""
        fresh = {e.url: e for e in wanted}
        for url, endpoint in fresh.items():
            if url in self.endpoints:
                self.endpoints[url].draining = endpoint.draining
                self.endpoints[url].bootstrap_port = endpoint.bootstrap_port
            else:
                self.endpoints[url] = endpoint
        for url in list(self.endpoints):
            if url not in fresh:
                del self.endpoints[url]

    def available(self, exclude: frozenset[str] | set[str] = frozenset()) -> list[Endpoint]:
        now = time.monotonic()
        return [
            e
            for e in self.endpoints.values()
            if not e.draining and e.url not in exclude and e.unreachable_until <= now
        ]


class Picker:
    """Chooses an endpoint of a pool for a request."""

    def __init__(self, policy: str, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._rng = rng or random.Random()
        self._turn = itertools.count()

    def pick(
        self, pool: Pool, prefix: str = "", exclude: set[str] | None = None
    ) -> Endpoint | None:
        candidates = sorted(pool.available(exclude or set()), key=lambda e: e.url)
        if not candidates:
            return None
        if self.policy == "round-robin":
            return candidates[next(self._turn) % len(candidates)]
        if self.policy == "prefix-affinity" and prefix:
            digest = int.from_bytes(
                hashlib.blake2b(prefix[:PREFIX_CHARS].encode(), digest_size=8).digest()
            )
            preferred = candidates[digest % len(candidates)]
            least = min(e.in_flight for e in candidates)
            if preferred.in_flight <= least + AFFINITY_SLACK:
                return preferred
        if len(candidates) == 1:
            return candidates[0]
        first, second = self._rng.sample(candidates, 2)
        return first if first.in_flight <= second.in_flight else second
