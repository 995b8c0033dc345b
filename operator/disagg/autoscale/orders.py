"""Replicas a pool was ordered and has not yet seen ready (pure): how long each took to start.

:class:`~disagg.autoscale.memory.PoolMemory` keeps the orders as (time first seen, replicas),
oldest first. An order is a rise of the replica count the pool is set to, not a replica that
is not ready: a pod restarting after a crash or a failed probe is no order (timed as one, a
30 s restart became the delay every surge, trend and look-back window is read over). The
oldest orders arrive first and each is timed from its own order (timed from the first of
overlapping scale-ups, a five-minute start read ten); a scale-down cancels the newest first,
as a Deployment deletes its pods that are not ready first.
"""

from __future__ import annotations

Orders = list[tuple[float, int]]


def note_orders(orders: Orders, wanted: int | None, current: int, ready: int, now: float) -> None:
    """Note in ``orders`` what the pool's replica count did since it was ``wanted`` (None:
    this is the first look, and whatever is not ready yet counts as ordered now, unless an
    order already says when)."""
    if wanted is None:
        pending = sum(count for _, count in orders)
        starting = max(0, current - ready)
        if starting > pending:
            orders.append((now, starting - pending))
    elif current > wanted:
        orders.append((now, current - wanted))
    elif current < wanted:
        take(orders, wanted - current, oldest=False)


def arrivals(orders: Orders, current: int, ready: int) -> int:
    """How many of the replicas ``orders`` still waits for are ready now: those ready beyond
    the pool's replicas that were not ordered."""
    pending = sum(count for _, count in orders)
    return max(0, min(ready, current) - (current - pending))


def take(orders: Orders, replicas: int, *, oldest: bool) -> float | None:
    """Remove ``replicas`` from the oldest (or newest) ``orders``; when the last one taken
    was ordered, None when there were none."""
    taken = None
    index = 0 if oldest else -1
    while replicas > 0 and orders:
        at, count = orders[index]
        used = min(count, replicas)
        replicas -= used
        taken = at
        if used < count:
            orders[index] = (at, count - used)
        else:
            del orders[index]
    return taken
