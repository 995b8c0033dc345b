"""Token counting without a tokenizer, and the simulator's deterministic output text.

The router and the simulator share :func:`estimate_tokens`, so a prompt the router calls
"short" is short to the engine too. About four characters per token is the usual rule of
thumb for English with BPE vocabularies.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Final

CHARS_PER_TOKEN: Final = 4.0
MESSAGE_OVERHEAD_TOKENS: Final = 4
_WORDS: Final = (
    "the",
    "model",
    "runs",
    "prefill",
    "then",
    "decode",
    "on",
    "separate",
    "GPUs",
    "and",
    "moves",
    "its",
    "cache",
    "over",
    "RDMA",
    "so",
    "tokens",
    "arrive",
    "steadily",
    "again",
)


def _text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def estimate_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens of a completion or chat request, estimated from its text."""
    if "messages" in body and isinstance(body["messages"], list):
        return sum(
            MESSAGE_OVERHEAD_TOKENS + _text_tokens(content_text(m.get("content")))
            for m in body["messages"]
            if isinstance(m, dict)
        )
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)  # token ids
        return sum(_text_tokens(str(p)) for p in prompt)
    return _text_tokens(str(prompt))


def continuation(body: dict[str, Any], answer: str) -> dict[str, Any] | None:
    """The request as the next turn of its conversation starts: the chat with the answer as
    the assistant's message, or a text prompt followed by the answer (None for token ids)."""
    if isinstance(body.get("messages"), list):
        return {**body, "messages": [*body["messages"], {"role": "assistant", "content": answer}]}
    if isinstance(body.get("prompt"), str):
        return {**body, "prompt": body["prompt"] + answer}
    return None


def output_token(request_id: str, index: int) -> str:
    """The ``index``-th output token of a request: a word, stable for a given request id."""
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=2).digest()
    return _WORDS[int.from_bytes(digest) % len(_WORDS)] + " "
