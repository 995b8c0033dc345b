"""When a decode engine prefills a prompt itself because the prefill pool is backed up
(conditional disaggregation), and how long a prompt would wait for the prefill pool.

Pure: times are passed in. The router and the fleet simulator run the same rule.

A burst that outgrows the prefill pool waits there while new prefill replicas start (a
provisioning delay, minutes on GPU nodes), and a decode pool serving short outputs has room
to spare. Sending a short prompt to a decode engine without a remote prefill makes that
engine compute it, chunked into its decode steps: the decode steps it shares slow down, so
each decode engine takes one such prompt at a time (by default), and only while the prefill
pool's wait is past a share of the TTFT SLO.

The wait is Little's law per prefill engine, on what this router sent it: the prompt tokens
still in flight there over the rate at which it finished them while busy. With several
router replicas each sees its share of both, so the ratio estimates the whole engine's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

RATE_MEMORY_SECONDS: Final = 10.0
"""How fast the finish-rate estimate forgets: older completions count e^-age/this."""


class DecodeEngine(Protocol):
    """What the rule needs of a decode engine (the router's endpoint, the simulator's engine)."""

    local_prefills: int
    """Offloaded prompts it is prefilling now (each until its first token)."""


DecodeT = TypeVar("DecodeT", bound=DecodeEngine)


@dataclass(frozen=True)
class Offload:
    """The rule: which prompts a decode engine prefills itself, and when."""

    max_prompt_tokens: int
    """Longer prompts always go to the prefill pool (0 turns offloading off)."""
    wait_seconds: float
    """Offload only while the least backed-up prefill engine would make a prompt wait longer."""
    per_decode_engine: int = 1
    """Offloaded prompts a decode engine computes at once (until their first token)."""

    def wanted(self, prompt_tokens: int, prefill_wait: float | None) -> bool:
        """Whether this prompt should skip a prefill pool that makes prompts wait so long."""
        return (
            0 < prompt_tokens <= self.max_prompt_tokens
            and prefill_wait is not None
            and prefill_wait > self.wait_seconds
        )

    def target(
        self,
        prompt_tokens: int,
        prefill_wait: float | None,
        decode: Iterable[DecodeT],
        load: Callable[[DecodeT], Any],
    ) -> DecodeT | None:
        """The decode engine that prefills this prompt itself: the least loaded of those
        with a slot free, when the prompt is wanted; else None."""
        if not self.wanted(prompt_tokens, prefill_wait):
            return None
        room = [e for e in decode if e.local_prefills < self.per_decode_engine]
        return min(room, key=load) if room else None


@contextmanager
def slot(engine: DecodeEngine) -> Iterator[Callable[[], None]]:
    """Holds one of ``engine``'s offload slots; the callback frees it (at the first token),
    and leaving the block frees it in any case."""
    engine.local_prefills += 1
    held = True

    def free() -> None:
        nonlocal held
        if held:
            held = False
            engine.local_prefills -= 1

    try:
        yield free
    finally:
        free()


@dataclass
class _Engine:
    in_flight_tokens: int = 0
    finished_tokens: float = 0.0
    """Prompt tokens finished, each weighted by how recently (decayed)."""
    busy_seconds: float = 0.0
    """Seconds with something in flight, decayed the same way."""
    since: float | None = None
    """When the decayed sums were last brought up to date."""


@dataclass
class PrefillBacklog:
    """Per prefill engine: prompt tokens in flight and how fast it finishes them."""

    engines: dict[str, _Engine] = field(default_factory=dict)

    def _advance(self, key: str, now: float) -> _Engine:
        engine = self.engines.setdefault(key, _Engine())
        if engine.since is not None and now > engine.since:
            elapsed = now - engine.since
            fade = math.exp(-elapsed / RATE_MEMORY_SECONDS)
            engine.finished_tokens *= fade
            # Time busy over the elapsed span, faded as if spread evenly across it.
            busy = (1 - fade) * RATE_MEMORY_SECONDS if engine.in_flight_tokens > 0 else 0.0
            engine.busy_seconds = engine.busy_seconds * fade + busy
        engine.since = now if engine.since is None else max(engine.since, now)
        return engine

    def sent(self, key: str, tokens: int, now: float) -> None:
        self._advance(key, now).in_flight_tokens += max(0, tokens)

    def finished(self, key: str, tokens: int, now: float, served: bool = True) -> None:
        """A prompt came back (``served``) or failed: it no longer waits there."""
        engine = self._advance(key, now)
        engine.in_flight_tokens = max(0, engine.in_flight_tokens - max(0, tokens))
        if served:
            engine.finished_tokens += max(0, tokens)

    def in_flight(self, key: str) -> int:
        """Prompt tokens sent to that engine and not back yet."""
        known = self.engines.get(key)
        return known.in_flight_tokens if known is not None else 0

    def forget(self, keep: set[str]) -> None:
        """Drop engines no longer in the pool."""
        for key in set(self.engines) - keep:
            del self.engines[key]

    def wait(self, key: str, now: float) -> float | None:
        """Seconds a new prompt would wait behind what is in flight there; None before the
        engine finished anything while busy (no rate to divide by) and 0 when it is idle."""
        engine = self._advance(key, now)
        if engine.in_flight_tokens == 0:
            return 0.0
        if engine.finished_tokens <= 0 or engine.busy_seconds <= 0:
            return None
        return engine.in_flight_tokens / (engine.finished_tokens / engine.busy_seconds)

    def least_wait(self, keys: list[str], now: float) -> float | None:
        """The shortest wait over these engines (where the router would send a prompt);
        None when any of them cannot be estimated yet, or there are none."""
        waits = [self.wait(key, now) for key in keys]
        if not waits or any(w is None for w in waits):
            return None
        return min(w for w in waits if w is not None)
