"""The OpenAI bodies the simulated engine answers with, as ``vllm serve`` shapes them: one
chunk of a streamed completion or chat completion, and a whole answer with its usage."""

from __future__ import annotations

import time
from typing import Any


def stream_chunk(
    kind: str, rid: str, model: str, text: str | None, finish: str | None, first: bool
) -> dict[str, Any]:
    """One server-sent event of a streamed answer (``first`` carries the assistant role)."""
    created = int(time.time())
    if kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
    choice = {
        "index": 0,
        "text": text or "",
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def full_answer(
    kind: str, rid: str, model: str, text: str, usage: dict[str, int]
) -> dict[str, Any]:
    """A whole answer, cut at max_tokens."""
    created = int(time.time())
    if kind == "chat":
        message = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": "length",
        }
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
