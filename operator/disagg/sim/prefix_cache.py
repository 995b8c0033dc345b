"""The engine simulator's prefix cache, as vLLM's automatic prefix caching does it (pure).

A prompt is cut into blocks of ``block_size`` tokens; each full block is named by a hash
chained from the block before it, so a block names its whole prefix. A new request reuses
the leading blocks already cached and computes only the rest (vLLM still computes the
prompt's last token, for its logits). Blocks of running requests are pinned; when they
finish their blocks stay cached and the least recently used unpinned ones are evicted once
the cache holds more blocks than the KV capacity.

Without a tokenizer the simulator's tokens are the units :func:`prompt_units` cuts the text
into: four characters each (the estimate :mod:`disagg.routing.tokens` counts), a role marker per
chat message, or the ids of a prompt given as token ids. A finished answer's blocks are
cached too, as the blocks of the conversation's next turn would begin (the chat with the
answer as the assistant's message, or the text prompt followed by it): vLLM keeps the
generated tokens' KV, and the chat template renders them into the next turn's prompt.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

from disagg.routing.tokens import CHARS_PER_TOKEN, MESSAGE_OVERHEAD_TOKENS, content_text

DEFAULT_BLOCK_SIZE: Final = 16
_CHARS: Final = int(CHARS_PER_TOKEN)


def _text_units(text: str) -> list[str]:
    return [text[i : i + _CHARS] for i in range(0, len(text), _CHARS)]


def prompt_units(body: dict[str, Any]) -> list[str]:
    """The prompt as the simulator's tokens: as many as estimate_tokens counts."""
    if isinstance(body.get("messages"), list):
        units: list[str] = []
        for message in body["messages"]:
            if isinstance(message, dict):
                role = str(message.get("role"))
                units += [f"<{role}>"] * MESSAGE_OVERHEAD_TOKENS
                units += _text_units(content_text(message.get("content")))
        return units
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return [str(t) for t in prompt]
        return [u for part in prompt for u in _text_units(str(part))]
    return _text_units(str(prompt))


def block_hashes(units: Sequence[str], block_size: int = DEFAULT_BLOCK_SIZE) -> list[bytes]:
    """The chained hash of each full block of ``units``."""
    hashes, parent = [], b""
    for start in range(0, len(units) - block_size + 1, block_size):
        block = "\x1f".join(units[start : start + block_size]).encode()
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Cached blocks by hash: pinned by the requests using them, else LRU-evictable."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._pins: dict[bytes, int] = {}
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        """Unpinned cached blocks, least recently used first."""

    def __len__(self) -> int:
        return len(self._pins) + len(self._lru)

    def cached_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks are cached."""
        count = 0
        for block in hashes:
            if block not in self._pins and block not in self._lru:
                break
            count += 1
        return count

    def acquire(self, hashes: Sequence[bytes]) -> int:
        """Pin a request's blocks (cached or newly computed); returns how many leading ones
        were cached already."""
        hits = self.cached_prefix(hashes)
        for block in hashes:
            self._lru.pop(block, None)
            self._pins[block] = self._pins.get(block, 0) + 1
        self._evict()
        return hits

    def insert(self, hashes: Sequence[bytes]) -> None:
        """Cache blocks no running request pins (a finished answer's), most recent last."""
        self.acquire(hashes)
        self.release(hashes)

    def release(self, hashes: Sequence[bytes]) -> None:
        """A request finished or was cancelled: its blocks stay cached, unpinned."""
        for block in hashes:
            pins = self._pins.get(block, 0) - 1
            if pins > 0:
                self._pins[block] = pins
            elif block in self._pins:
                del self._pins[block]
                self._lru[block] = None
        self._evict()

    def _evict(self) -> None:
        while len(self) > self.capacity_blocks and self._lru:
            self._lru.popitem(last=False)
