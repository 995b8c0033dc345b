"""A request's prompt as the router sees it for cache-aware routing: its token count and the
chained hash of each full block of tokens (pure, apart from loading a tokenizer file).

The hashes only have to agree with themselves: they name what the router sent where, not
the engines' own block ids, so any tokenization that is stable across requests works. With
the model's tokenizer (``--tokenizer``, a Hugging Face ``tokenizer.json`` read by the
``tokenizers`` library) counts and block edges are the engine's; without it a token is four
characters (:func:`disagg.routing.tokens.estimate_tokens`, the count the pd threshold uses).

A chat prompt is its messages in order, each a role marker and then its content, so turn
N+1 starts with the blocks of turn N: what the engine's prefix cache reuses once the chat
template has rendered the same messages the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from disagg.routing.prompt import Prompt
from disagg.routing.tokens import CHARS_PER_TOKEN, content_text, estimate_tokens

DEFAULT_BLOCK_SIZE: Final = 16
"""vLLM's default KV block size: the grain at which a prefix cache hits."""
_CHARS: Final = int(CHARS_PER_TOKEN)


def chain(pieces: Sequence[bytes]) -> tuple[bytes, ...]:
    """Hash each piece together with the hash before it, so a block names its whole prefix."""
    hashes, parent = [], b""
    for piece in pieces:
        parent = hashlib.blake2b(parent + piece, digest_size=8).digest()
        hashes.append(parent)
    return tuple(hashes)


def _token_id_prompt(body: dict[str, Any]) -> list[int] | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


def _id_blocks(ids: Sequence[int], block_size: int) -> tuple[bytes, ...]:
    full = len(ids) - len(ids) % block_size
    return chain([
        json.dumps(list(ids[i : i + block_size])).encode() for i in range(0, full, block_size)
    ])  # fmt: skip


class PromptReader(Protocol):
    """Turns a request body into a :class:`Prompt`."""

    description: str
    block_size: int

    def read(self, body: dict[str, Any]) -> Prompt: ...


class CharacterReader:
    """Four characters per token, no tokenizer: the same count the pd threshold uses."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = block_size
        self.description = f"estimate: {_CHARS} characters per token, {block_size}-token blocks"

    def _text(self, body: dict[str, Any]) -> str:
        if isinstance(body.get("messages"), list):
            return "".join(
                f"\x1e{m.get('role')}\x1f{content_text(m.get('content'))}"
                for m in body["messages"]
                if isinstance(m, dict)
            )
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            return "\x1e".join(str(p) for p in prompt)
        return str(prompt)

    def read(self, body: dict[str, Any]) -> Prompt:
        ids = _token_id_prompt(body)
        if ids is not None:
            return Prompt(len(ids), _id_blocks(ids, self.block_size))
        text = self._text(body)
        span = self.block_size * _CHARS
        full = len(text) - len(text) % span
        pieces = [text[i : i + span].encode("utf-8", "surrogatepass") for i in range(0, full, span)]
        blocks = chain(pieces)
        return Prompt(estimate_tokens(body), blocks)


class TokenizerReader:
    """The model's own tokenizer: counts and block edges as the engine has them."""

    def __init__(self, path: Path, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        from tokenizers import Tokenizer

        file = path / "tokenizer.json" if path.is_dir() else path
        self._tokenizer = Tokenizer.from_file(str(file))
        self.block_size = block_size
        self.description = f"tokenizer {file}, {block_size}-token blocks"

    def _ids(self, body: dict[str, Any]) -> list[int]:
        ids = _token_id_prompt(body)
        if ids is not None:
            return ids
        encode = self._tokenizer.encode
        if isinstance(body.get("messages"), list):
            out: list[int] = []
            for message in body["messages"]:
                if isinstance(message, dict):
                    out += encode(f"<|{message.get('role')}|>", add_special_tokens=False).ids
                    out += encode(
                        content_text(message.get("content")), add_special_tokens=False
                    ).ids
            return out
        prompt = body.get("prompt", "")
        parts = prompt if isinstance(prompt, list) else [prompt]
        return [i for part in parts for i in encode(str(part), add_special_tokens=False).ids]

    def read(self, body: dict[str, Any]) -> Prompt:
        ids = self._ids(body)
        return Prompt(len(ids), _id_blocks(ids, self.block_size))


class TokenizerUnavailable(ValueError):
    """``--tokenizer`` names something that cannot be loaded; the message says what."""


def prompt_reader(tokenizer: str | None, block_size: int = DEFAULT_BLOCK_SIZE) -> PromptReader:
    """The model's tokenizer when one is given, else the character estimate."""
    if tokenizer is None:
        return CharacterReader(block_size)
    path = Path(tokenizer)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerUnavailable(f"--tokenizer {tokenizer}: no tokenizer file at {file}")
    try:
        return TokenizerReader(path, block_size)
    except ImportError as missing:
        raise TokenizerUnavailable(
            "--tokenizer needs the `tokenizers` package (pip install 'disagg-operator[tokenizer]')"
        ) from missing
    except Exception as broken:  # the library raises its own exception type for bad files
        raise TokenizerUnavailable(
            f"--tokenizer {tokenizer}: {file} is not a tokenizer file: {broken}"
        ) from broken
