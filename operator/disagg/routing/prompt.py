"""A request's prompt as routing sees it: its token count and the chained hashes of its
full blocks (read by :mod:`disagg.router.prompt_blocks`; cache-aware choice,
:mod:`disagg.routing.affinity`, matches them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """What the router knows of one request's prompt."""

    tokens: int
    blocks: tuple[bytes, ...]
    """Chained hash of each full block, in prompt order."""
