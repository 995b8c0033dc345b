"""A keyed work queue: each model is reconciled by at most one task at a time.

Events for a model that is being reconciled mark it dirty, and it runs once more when the
current pass ends; events for a model waiting for a free slot join the pass it waits for. So
bursts of child events (a rollout touches many pods) coalesce into few passes, and more so
the busier the operator is. Failures retry with capped exponential backoff, never in a hot
loop. A pass can ask to run again after a delay (the autoscaler's interval): one timer per
key, the earliest wins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

log = logging.getLogger("disagg.queue")
Key = tuple[str, str]
MAX_BACKOFF: Final = 60.0


class WorkQueue:
    """Runs ``work(key)`` for dirty keys, up to ``concurrency`` keys at once."""

    def __init__(
        self, work: Callable[[Key], Awaitable[None]], concurrency: int = 4, debounce: float = 0.1
    ) -> None:
        self._work = work
        self._debounce = debounce
        self._slots = asyncio.Semaphore(concurrency)
        self._dirty: set[Key] = set()
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, key: Key) -> None:
        """Mark a key for reconciliation (cheap; safe to call for every event)."""
        if self._closed:
            return
        self._dirty.add(key)
        self._idle.clear()
        if key not in self._running:
            self._running[key] = asyncio.create_task(self._drain(key), name=f"reconcile {key}")

    def add_after(self, key: Key, delay: float) -> None:
        """Mark a key for reconciliation in ``delay`` seconds (sooner if already due sooner)."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + max(0.0, delay)
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= at:
                return
            timer.cancel()
        self._timers[key] = loop.call_at(at, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def forget_timers(self) -> None:
        """Drop every delayed add (leadership lost: the next leader schedules its own)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    async def _drain(self, key: Key) -> None:
        try:
            while key in self._dirty and not self._closed:
                await asyncio.sleep(self._debounce)
                async with self._slots:
                    # Marked clean only once a slot is free: events that arrive while the key
                    # waits for one are read by the pass it waits to run, not by another.
                    self._dirty.discard(key)
                    try:
                        await self._work(key)
                        self._failures.pop(key, None)
                    except asyncio.CancelledError:
                        raise
                    except Exception as error:  # one model's failure must not stop the others
                        count = self._failures.get(key, 0) + 1
                        self._failures[key] = count
                        delay = min(MAX_BACKOFF, 0.5 * 2**count)
                        log.warning(
                            "Reconcile failed for %s/%s (attempt %d, retry in %.1fs): %s",
                            key[0],
                            key[1],
                            count,
                            delay,
                            error,
                        )
                        self._dirty.add(key)
                        await asyncio.sleep(delay)
        finally:
            self._running.pop(key, None)
            if not self._running:
                self._idle.set()

    async def idle(self) -> None:
        """Wait until no key is dirty or running."""
        await self._idle.wait()

    def pending(self) -> int:
        return len(self._dirty) + len(self._running)

    async def close(self) -> None:
        self._closed = True
        self.forget_timers()
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
