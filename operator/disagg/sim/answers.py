"""The OpenAI bodies the simulated engine answers with, as ``vllm serve`` shapes them: one
chunk of a streamed completion or chat completion, and a whole answer with its usage."""

from __future__ import annotations

import time
from typing import Any


def _body(obj: str, rid: str, model: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice]}  # fmt: skip


def _text_choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
            "stop_reason": None}  # fmt: skip


def stream_chunk(
    kind: str, rid: str, model: str, text: str | None, finish: str | None, first: bool
) -> dict[str, Any]:
    """One server-sent event of a streamed answer (``first`` carries the assistant role)."""
    if kind != "chat":
        return _body("text_completion", rid, model, _text_choice(text or "", finish))
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _body("chat.completion.chunk", rid, model, choice)


def full_answer(
    kind: str, rid: str, model: str, text: str, usage: dict[str, int]
) -> dict[str, Any]:
    """A whole answer, cut at max_tokens."""
    if kind == "chat":
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
        body = _body("chat.completion", rid, model, choice)
    else:
        body = _body("text_completion", rid, model, _text_choice(text, "length"))
    return {**body, "usage": usage}
