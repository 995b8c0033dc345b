"""What a pool's scale-down look-back learns at each evaluation, says and shares (pure).

The look-back itself lives in :class:`~disagg.autoscale.memory.PoolMemory` (learned from
flaps, surges and bursts' ends, forgotten an hour after the last of them); this module reads
the surge and the burst's end of one evaluation into it, shares it between the pools of a
model and words what changed it for the decision's reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from disagg.autoscale.memory import LOOK_BACK_MEMORY, PoolMemory
from disagg.autoscale.model import Behavior, PoolName

__all__ = ["LookBackReading", "read_look_back", "share_look_back"]


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


@dataclass(frozen=True)
class LookBackReading:
    """What one evaluation read that changes the look-back."""

    surge: float | None
    """Arrivals over their level one to two provisioning delays ago (a scale-up for it
    holds the look-back of a burst)."""
    plunge: float | None
    """Their level over the arrivals now, when a decode pool read a burst's end."""
    forgotten: float | None
    """The learned look-back an hour without bursts just halved."""

    def hold_absorbed(
        self, pool: PoolName, memory: PoolMemory, behavior: Behavior, now: float, *,
        within_slo: bool,
    ) -> bool:  # fmt: skip
        """Whether the pool absorbs this surge at the size it holds, all of it ready and
        ``within_slo``, arriving on steady traffic (PoolMemory.over_steady); if so that size
        is what a burst takes, and it is held as a surge's scale-up holds what it ordered (a
        bigger burst after a smaller one found the pool given back). Read where requests
        arrive: what reaches a decode pool also surges when a prefill backlog drains."""
        if pool != "prefill" or self.surge is None or not within_slo:
            return False
        if not memory.over_steady(now):
            return False
        memory.hold_burst(now, behavior.down_window)
        return True

    def news(self, memory: PoolMemory, configured: float, *, scaled_up: bool) -> str:
        """What this evaluation changed in the look-back, for the decision's reason: a
        surge's scale-up or a burst's end that lengthened it (to what ``memory`` holds now,
        a flap's included), or an hour without either that halved it; "" when nothing did."""
        delays = f"{memory.provisioning:.0f}-{2 * memory.provisioning:.0f}s ago"
        held = f"held {memory.down_window:.0f}s before scaling down"
        news = ""
        if self.surge is not None and scaled_up:
            news += f"; arrivals {self.surge:.1f}x their level {delays}, a surge: {held}"
        if self.plunge is not None:
            fell = "to nothing from" if math.isinf(self.plunge) else f"to 1/{self.plunge:.1f} of"
            news += f"; arrivals fell {fell} their level {delays}, a burst's end: {held}"
        if self.forgotten is not None:
            now_held = max(memory.down_window, configured)
            news += (
                f"; look-back {self.forgotten:.0f} -> {now_held:.0f}s: no flap, surge or "
                f"burst's end for {LOOK_BACK_MEMORY:.0f}s"
            )
        return news


def read_look_back(
    pool: PoolName, memory: PoolMemory, behavior: Behavior, now: float
) -> LookBackReading:
    """Read this evaluation's surge (held if the pool scales up for it) and burst's end
    (held now), and forget a learned look-back an hour old; the arrivals are noted first."""
    surge = memory.surge(now, behavior.window)
    forgotten = memory.forget(now, behavior.down_window)
    # A burst's end is read where every request ends: what reaches a prefill pool also
    # falls when long prompts back it up and the router offloads short ones to decode.
    plunge = memory.plunge(now, behavior.window) if pool == "decode" else None
    if plunge is not None:
        memory.hold_burst(now, behavior.down_window)
    return LookBackReading(surge, plunge, forgotten)
