"""What a pool's scale-down look-back says and shares (pure).

The look-back itself is learned in :class:`~disagg.autoscale.model.PoolMemory` (from flaps,
surges and bursts' ends, forgotten an hour after the last of them); this module shares it
between the pools of a model and words what changed it for the decision's reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from disagg.autoscale.model import LOOK_BACK_MEMORY, PoolMemory

__all__ = ["look_back_news", "share_look_back"]


def share_look_back(memories: Iterable[PoolMemory]) -> None:
    """Give every pool of a model the scale-down look-back any of them learned or forgot
    last (of those changed at once, the longest).

    Every request passes through both pools, so a burst that came back to one (its
    scale-down undone within FLAP_SECONDS) comes back to the other: a decode pool that has
    not flapped yet would otherwise shrink between bursts its prefill pool already holds
    for, and meet the next one a replica short. Learning starts from the shared look-back,
    so the newest is also the longest, until an hour without bursts halves it: then the
    halved one is the newest, and the pools forget it together."""
    pools = list(memories)
    if not pools:
        return

    def recency(memory: PoolMemory) -> tuple[float, float]:
        learned = -math.inf if memory.learned_at is None else memory.learned_at
        return learned, memory.down_window

    longest = max(pools, key=recency)
    for memory in pools:
        memory.down_window, memory.learned_at = longest.down_window, longest.learned_at


def look_back_news(
    memory: PoolMemory,
    configured: float,
    *,
    surge: float | None,
    plunge: float | None,
    forgotten: float | None,
) -> str:
    """What this evaluation changed in the look-back, for the decision's reason: a surge's
    scale-up or a burst's end that lengthened it (to what ``memory`` holds now, a flap's
    included), or an hour without either that halved it; "" when nothing did."""
    delays = f"{memory.provisioning:.0f}-{2 * memory.provisioning:.0f}s ago"
    held = f"held {memory.down_window:.0f}s before scaling down"
    news = ""
    if surge is not None:
        news += f"; arrivals {surge:.1f}x their level {delays}, a surge: {held}"
    if plunge is not None:
        fell = "to nothing from" if math.isinf(plunge) else f"to 1/{plunge:.1f} of"
        news += f"; arrivals fell {fell} their level {delays}, a burst's end: {held}"
    if forgotten is not None:
        now_held = max(memory.down_window, configured)
        news += (
            f"; look-back {forgotten:.0f} -> {now_held:.0f}s: no flap, surge or burst's end "
            f"for {LOOK_BACK_MEMORY:.0f}s"
        )
    return news
