"""The work queue: one pass per model at a time, bursts coalesce, failures retry."""

from __future__ import annotations

import asyncio

from disagg.reconcile.queue import Key, WorkQueue
from test_control_loops import until


async def test_bursts_coalesce_and_keys_never_run_concurrently() -> None:
    running: set[Key] = set()
    passes: list[Key] = []
    overlap = False

    async def work(key: Key) -> None:
        nonlocal overlap
        overlap = overlap or key in running
        running.add(key)
        await asyncio.sleep(0.05)
        passes.append(key)
        running.discard(key)

    queue = WorkQueue(work, concurrency=2, debounce=0.01)
    for _ in range(20):
        queue.add(("ns", "a"))
    queue.add(("ns", "b"))
    await asyncio.sleep(0.02)
    queue.add(("ns", "a"))  # arrives while "a" runs: exactly one more pass
    await asyncio.wait_for(queue.idle(), timeout=5)
    assert not overlap
    assert passes.count(("ns", "a")) == 2 and passes.count(("ns", "b")) == 1
    await queue.close()


async def test_a_failing_key_retries_without_blocking_others() -> None:
    attempts: dict[str, int] = {"bad": 0, "good": 0}

    async def work(key: Key) -> None:
        attempts[key[1]] += 1
        if key[1] == "bad" and attempts["bad"] < 2:
            raise RuntimeError("transient")

    queue = WorkQueue(work, concurrency=1, debounce=0.0)
    queue.add(("ns", "bad"))
    queue.add(("ns", "good"))
    await asyncio.wait_for(queue.idle(), timeout=5)
    assert attempts == {"bad": 2, "good": 1}
    await queue.close()


async def test_events_for_a_key_waiting_for_a_slot_join_the_pass_it_waits_for() -> None:
    release = asyncio.Event()
    passes: list[Key] = []

    async def work(key: Key) -> None:
        passes.append(key)
        if key[1] == "busy":
            await release.wait()

    queue = WorkQueue(work, concurrency=1, debounce=0.0)
    queue.add(("ns", "busy"))
    await until(lambda: passes == [("ns", "busy")])  # it holds the only slot
    for _ in range(5):
        queue.add(("ns", "waiting"))
        await asyncio.sleep(0.01)  # each event arrives after the key began to wait
    release.set()
    await asyncio.wait_for(queue.idle(), timeout=5)
    assert passes == [("ns", "busy"), ("ns", "waiting")]
    await queue.close()
