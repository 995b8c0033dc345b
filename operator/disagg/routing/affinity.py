"""Cache-aware engine choice (pure): the router's record of which prompt blocks it sent to
which engine, the choice of an engine from that record and its load, and whether a decode
engine should prefill a request itself.

The record is what this router process sent, not what the engines report: an engine that
evicted a block, or a request another router replica sent, is not in it, and a restart
starts it empty (requests are unaffected; only the first turns after it lose their
affinity). It is bounded: ``budget`` blocks over all engines of a pool, each engine keeping
its most recently sent ones, and an engine that leaves the pool is forgotten.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from disagg.routing.prompt import Prompt

DEFAULT_BUDGET: Final = 1 << 18
"""Blocks remembered per pool: 4M tokens at 16 per block, about 30 MB."""
MIN_PER_ENGINE: Final = 1024


@dataclass(frozen=True)
class Slack:
    """An engine is too busy for affinity once it has more requests in flight than the least
    busy one by ``requests``, or by ``fraction`` of the least busy one's, whichever is more."""

    requests: int
    fraction: float

    def exceeded(self, in_flight: int, least: int) -> bool:
        return in_flight > least + max(self.requests, math.ceil(least * self.fraction))


PREFILL_SLACK: Final = Slack(4, 0.25)
"""A prefill engine serves its queue in turn: every request ahead is a prompt to wait for."""
DECODE_SLACK: Final = Slack(8, 0.5)
"""A decode engine batches: a few more sequences lengthen each step a little, while moving a
conversation elsewhere costs its whole context's prefill and KV transfer."""


class AffinityRecord:
    """Per engine URL, the prompt blocks last sent there, least recently sent first."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self._sent: dict[str, OrderedDict[bytes, None]] = {}

    def held(self, url: str, blocks: Sequence[bytes]) -> int:
        """How many of the prompt's leading blocks were sent to ``url``."""
        sent = self._sent.get(url)
        if not sent:
            return 0
        count = 0
        for block in blocks:
            if block not in sent:
                break
            count += 1
        return count

    def note(self, url: str, blocks: Sequence[bytes]) -> None:
        """``url`` now computes (or holds) these blocks."""
        if not blocks:
            return
        sent = self._sent.setdefault(url, OrderedDict())
        for block in blocks:
            sent[block] = None
            sent.move_to_end(block)
        room = max(MIN_PER_ENGINE, self.budget // len(self._sent))
        while len(sent) > room:
            sent.popitem(last=False)

    def retain(self, urls: Collection[str]) -> None:
        """Forget engines no longer in the pool."""
        for url in [u for u in self._sent if u not in urls]:
            del self._sent[url]

    @property
    def engines(self) -> set[str]:
        return set(self._sent)

    def blocks(self, url: str) -> int:
        return len(self._sent.get(url, ()))


@dataclass(frozen=True)
class Choice:
    """The engine picked for a request and how many of its prompt blocks it holds."""

    url: str
    held_blocks: int


def choose(
    candidates: Sequence[tuple[str, int]],
    record: AffinityRecord,
    prompt: Prompt,
    rng: random.Random,
    slack: Slack = PREFILL_SLACK,
    work: Mapping[str, float] | None = None,
) -> Choice | None:
    """Of ``(url, in_flight)`` candidates, the one holding most of the prompt's leading
    blocks unless it is overloaded; with no such engine, the one with the least ``work``
    in flight when given (:func:`least_work`), else the less busy of two at random (least
    outstanding requests, as without affinity)."""
    if not candidates:
        return None
    least = min(n for _, n in candidates)
    held = {url: record.held(url, prompt.blocks) for url, _ in candidates}
    fit = [(url, n) for url, n in candidates if not slack.exceeded(n, least)]
    best_url, _ = max(fit, key=lambda c: (held[c[0]], -c[1]))
    if held[best_url] > 0:
        return Choice(best_url, held[best_url])
    if len(candidates) == 1:
        return Choice(candidates[0][0], held[candidates[0][0]])
    if work is not None:
        url = least_work(candidates, work, rng)
        return Choice(url, held[url])
    first, second = rng.sample(list(candidates), 2)
    url = first[0] if first[1] <= second[1] else second[0]
    return Choice(url, held[url])


def least_work(
    candidates: Sequence[tuple[str, int]],
    work: Mapping[str, float],
    rng: random.Random | None = None,
) -> str:
    """Of non-empty ``(key, in_flight)`` candidates, the one with the least work in flight
    (a prefill engine's prompt tokens); fewer requests break a tie, then ``rng`` (so that
    idle engines share what several router replicas send at once), else the order given.

    A prefill engine computes its queue in turn, so what a new prompt waits for is the
    tokens ahead of it, not the requests: counted by requests, one engine busy with a
    100k-token prompt looks as free as one with a 100-token prompt, and every prompt sent
    to it waits seconds."""
    order = rng.sample(list(candidates), len(candidates)) if rng is not None else candidates
    key, _ = min(order, key=lambda c: (work.get(c[0], 0.0), c[1]))
    return key


@dataclass(frozen=True)
class LocalPrefill:
    """When a decode engine prefills a request itself instead of fetching its KV."""

    max_uncached_tokens: int = 512
    """The uncached suffix a decode engine computes itself, at most."""
    min_cached_fraction: float = 0.5
    """Of the prompt, the share the decode engine must hold already."""

    def applies(self, prompt: Prompt, held_blocks: int, block_size: int) -> bool:
        cached = min(prompt.tokens, held_blocks * block_size)
        if cached <= 0 or prompt.tokens <= 0:
            return False
        uncached = prompt.tokens - cached
        return (
            uncached <= self.max_uncached_tokens
            and cached / prompt.tokens >= self.min_cached_fraction
        )


def decode_alone(
    prompt: Prompt,
    held_blocks: int,
    block_size: int,
    pd_threshold: int,
    local: LocalPrefill | None,
) -> str | None:
    """The path of a request its decode engine serves without a remote prefill, or None.

    Decided on what the engine would compute, the prompt's uncached suffix, not on the
    prompt's length: ``local-prefill`` when it holds all but a short suffix (or the suffix
    is under the pd threshold), ``skipped`` for a short prompt it holds nothing of.
    """
    cached = min(prompt.tokens, held_blocks * block_size)
    if cached > 0 and local is not None and local.applies(prompt, held_blocks, block_size):
        return "local-prefill"
    if prompt.tokens - cached < pd_threshold:
        return "local-prefill" if cached > 0 else "skipped"
    return None
