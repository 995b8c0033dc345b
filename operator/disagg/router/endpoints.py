"""Worker endpoints of a pool and how one is picked (pure apart from the random source).

Least outstanding requests uses power-of-two choices: sample two healthy endpoints, take
the one with fewer requests in flight. Where the router counts what each endpoint has in
flight in the units it serves (a vLLM prefill pool's prompt tokens), the choice by load is
the endpoint with the least of that instead (:func:`~disagg.routing.affinity.least_work`).
Cache-aware (:mod:`disagg.routing.affinity`) sends a
request where the router sent its prompt's leading blocks before, unless that engine is
overloaded, and is least-outstanding otherwise. Prefix affinity hashes the start of the
prompt onto a stable endpoint, falling back to least-outstanding when that endpoint is much
busier than the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from disagg.routing.affinity import (
    DECODE_SLACK,
    PREFILL_SLACK,
    AffinityRecord,
    choose,
    least_work,
)
from disagg.routing.prompt import Prompt

POLICIES: Final = ("cache-aware", "least-outstanding", "round-robin", "prefix-affinity")
PREFIX_CHARS: Final = 256
AFFINITY_SLACK: Final = 4


@dataclass(eq=False)
class Endpoint:
    """One engine: its base URL and what the router knows about it."""

    url: str
    name: str = ""
    bootstrap_port: int | None = None
    in_flight: int = 0
    local_prefills: int = 0
    """Prompts offloaded here (prefilled by this decode engine) with no first token yet."""
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

    def __init__(
        self, policy: str, rng: random.Random | None = None, affinity_budget: int | None = None
    ) -> None:
        self.policy = policy
        self._rng = rng or random.Random()
        self._turn = itertools.count()
        self._affinity_budget = affinity_budget
        self.records: dict[str, AffinityRecord] = {}
        """Cache-aware policy: what was sent where, per pool role."""

    @property
    def cache_aware(self) -> bool:
        return self.policy == "cache-aware"

    def record(self, pool: Pool) -> AffinityRecord:
        record = self.records.get(pool.role)
        if record is None:
            budget = self._affinity_budget
            record = self.records[pool.role] = (
                AffinityRecord() if budget is None else AffinityRecord(budget)
            )
        if record.engines - pool.endpoints.keys():  # engines gone since the last request
            record.retain(pool.endpoints.keys())
        return record

    def held(self, pool: Pool, endpoint: Endpoint, prompt: Prompt | None) -> int:
        """Leading prompt blocks the router sent to ``endpoint`` before (cache-aware only)."""
        if prompt is None or not self.cache_aware:
            return 0
        return self.record(pool).held(endpoint.url, prompt.blocks)

    def note(self, pool: Pool, endpoint: Endpoint, prompt: Prompt | None) -> None:
        """``endpoint`` was sent this prompt: it will hold its blocks."""
        if prompt is not None and self.cache_aware:
            self.record(pool).note(endpoint.url, prompt.blocks)

    def describe(self, pool: Pool) -> list[dict[str, object]]:
        """What the router knows of each endpoint (``/debug/endpoints``)."""
        rows: list[dict[str, object]] = []
        for e in sorted(pool.endpoints.values(), key=lambda e: e.url):
            row: dict[str, object] = {
                "url": e.url, "name": e.name, "in_flight": e.in_flight, "draining": e.draining
            }  # fmt: skip
            if self.cache_aware:
                row["cached_blocks"] = self.record(pool).blocks(e.url)
            rows.append(row)
        return rows

    def pick(
        self,
        pool: Pool,
        prefix: str = "",
        exclude: set[str] | None = None,
        prompt: Prompt | None = None,
        work: Mapping[str, float] | None = None,
    ) -> Endpoint | None:
        """An endpoint for a request. ``work``: what each endpoint has in flight from this
        router, in the units it serves (a prefill pool's prompt tokens); with it, a choice by
        load takes the least of it instead of the less busy of two by requests."""
        candidates = sorted(pool.available(exclude or set()), key=lambda e: e.url)
        if not candidates:
            return None
        by_url = {e.url: e for e in candidates}
        if self.cache_aware and prompt is not None:
            slack = DECODE_SLACK if pool.role == "decode" else PREFILL_SLACK
            choice = choose(
                [(e.url, e.in_flight) for e in candidates],
                self.record(pool),
                prompt,
                self._rng,
                slack,
                work,
            )
            return by_url[choice.url] if choice is not None else None
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
        if work is not None:
            return by_url[least_work([(e.url, e.in_flight) for e in candidates], work, self._rng)]
        first, second = self._rng.sample(candidates, 2)
        return first if first.in_flight <= second.in_flight else second
