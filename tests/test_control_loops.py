"""The operator's and the router's loops against the in-memory API server, with a clock the
test drives: leader election, delayed requeues, the router's pod watch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from disagg.reconcile.leader import LeaderElector
from disagg.reconcile.queue import Key, WorkQueue
from disagg.router.discovery import watch_pool
from disagg.router.endpoints import Pool
from fakekube import FakeKube

Obj = dict[str, Any]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def until(condition: Callable[[], bool], limit: float = 5.0) -> None:
    """Wait for a condition other tasks make true, yielding to them, for at most ``limit`` s."""
    async with asyncio.timeout(limit):
        # The state is the loops' own (a pool, a list of passes): there is no event to await.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


def elector(kube: FakeKube, clock: Clock, changes: list[bool]) -> LeaderElector:
    return LeaderElector(
        kube,  # type: ignore[arg-type]
        "ops", "disagg-operator", changes.append, lease_seconds=15, clock=clock,
    )  # fmt: skip


async def test_one_replica_leads_and_a_standby_takes_over_only_after_the_lease_expires() -> None:
    kube, clock = FakeKube(), Clock()
    first_changes: list[bool] = []
    second_changes: list[bool] = []
    first, second = elector(kube, clock, first_changes), elector(kube, clock, second_changes)
    assert await first.try_once()
    assert not await second.try_once()
    clock.now += 10
    assert await first.try_once()  # renewed
    clock.now += 14
    assert not await second.try_once()  # 14 s since the renewal: still held
    clock.now += 2
    assert await second.try_once()  # the leader missed its deadline
    lease = kube.stored("Lease", "ops", "disagg-operator")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == second.identity
    assert lease["spec"]["leaseTransitions"] == 1
    assert not await first.try_once()  # the old leader finds it lost and stands by


async def test_two_candidates_racing_for_an_expired_lease_produce_one_leader() -> None:
    kube, clock = FakeKube(), Clock()
    a, b = elector(kube, clock, []), elector(kube, clock, [])
    assert await a.try_once()
    clock.now += 30
    lease = await kube.get("Lease", "ops", "disagg-operator")
    assert lease is not None
    await kube.replace(lease)  # someone renewed between b's read and b's write: b gets a 409
    real_get = kube.get

    async def stale_get(kind: str, namespace: str | None, name: str) -> Obj | None:
        return lease if kind == "Lease" else await real_get(kind, namespace, name)

    kube.get = stale_get  # type: ignore[method-assign]
    assert not await b.try_once()


async def test_a_failed_renewal_drops_leadership_until_the_lease_is_renewed_again() -> None:
    kube, clock = FakeKube(), Clock()
    changes: list[bool] = []
    leader = LeaderElector(
        kube, "ops", "disagg-operator", changes.append,  # type: ignore[arg-type]
        renew_seconds=0.001, clock=clock,
    )  # fmt: skip
    task = asyncio.create_task(leader.run())
    try:
        await until(lambda: changes == [True])
        kube.fail_next("Lease", "update", 503)  # the API server is unavailable for one round
        await until(lambda: changes == [True, False, True])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_delayed_add_runs_the_key_once_and_the_earliest_delay_wins() -> None:
    passes: list[Key] = []
    queue = WorkQueue(lambda key: _record(passes, key), concurrency=1, debounce=0.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    queue.add_after(("ns", "m"), 30.0)
    queue.add_after(("ns", "m"), 0.05)  # sooner: replaces the 30 s timer
    queue.add_after(("ns", "m"), 10.0)  # later than the pending one: ignored
    await until(lambda: len(passes) == 1)
    assert loop.time() - started < 10
    queue.add_after(("ns", "forgotten"), 0.01)
    queue.forget_timers()  # leadership lost: nothing scheduled runs
    queue.add_after(("ns", "later"), 0.05)
    await until(lambda: len(passes) == 2)
    assert passes == [("ns", "m"), ("ns", "later")]
    await queue.close()


async def _record(passes: list[Key], key: Key) -> None:
    passes.append(key)


def _pod(name: str, ip: str, *, ready: bool = True, role: str = "decode") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team",
                     "labels": {"disagg.dev/model": "m", "disagg.dev/role": role}},
        "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


async def test_the_router_follows_ready_pods_and_resumes_after_the_watch_ends() -> None:
    kube = FakeKube()
    kube.put(_pod("decode-a", "10.0.0.1"))
    kube.put(_pod("prefill-a", "10.0.0.9", role="prefill"))
    pool = Pool("decode")
    listed = asyncio.Event()
    task = asyncio.create_task(
        watch_pool(kube, "team", "disagg.dev/model=m,disagg.dev/role=decode", pool, listed)  # type: ignore[arg-type]
    )
    try:
        await asyncio.wait_for(listed.wait(), 5)

        def urls() -> set[str]:
            return {e.url for e in pool.available()}

        assert urls() == {"http://10.0.0.1:8000"}  # the prefill pod is not a decode endpoint
        await until(lambda: len(kube.watchers) == 1)
        kube.put(_pod("decode-b", "10.0.0.2", ready=False))
        kube.put(_pod("decode-b", "10.0.0.2"))
        await until(lambda: urls() == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"})
        draining = _pod("decode-a", "10.0.0.1")
        draining["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        kube.put(draining)  # terminating: finishes its requests, gets no new ones
        await until(lambda: urls() == {"http://10.0.0.2:8000"})
        kube.end_watches()
        await until(lambda: len(kube.watchers) == 1)  # listed again and watching
        await kube.delete("Pod", "team", "decode-a")
        kube.put(_pod("decode-c", "10.0.0.3"))
        await until(lambda: urls() == {"http://10.0.0.2:8000", "http://10.0.0.3:8000"})
        assert "http://10.0.0.1:8000" not in pool.endpoints
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
