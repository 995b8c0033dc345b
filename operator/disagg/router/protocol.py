"""The request shapes of the P/D protocols (pure), exactly as the engines expect them.

vLLM NIXL (pull): the prefill engine gets a copy of the request with ``max_tokens: 1``,
``stream: false``, no ``stream_options``, and ``kv_transfer_params`` asking for a remote
decode; the decode engine then gets the original request with the ``kv_transfer_params``
the prefill engine returned, copied in unchanged. SGLang: both engines get the same request
with ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` added, at the same time.
"""

from __future__ import annotations

import codecs
import copy
import json
from typing import Any, Final

from disagg.nesting import levels

PREFILL_KV_PARAMS: Final[dict[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_PREFILL_DROPPED: Final = ("stream_options", "min_tokens", "min_completion_tokens")


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The request a vLLM prefill engine gets: one token, no streaming, remote decode."""
    prefill = copy.deepcopy(body)
    for key in _PREFILL_DROPPED:
        prefill.pop(key, None)
    prefill["max_tokens"] = 1
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    prefill["stream"] = False
    prefill["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return prefill


def decode_request(
    body: dict[str, Any], kv_transfer_params: dict[str, Any] | None
) -> dict[str, Any]:
    """The request a decode engine gets: the original, plus the prefill's KV params verbatim."""
    decode = copy.deepcopy(body)
    decode.pop("kv_transfer_params", None)
    if kv_transfer_params is not None:
        decode["kv_transfer_params"] = kv_transfer_params
    return decode


def sglang_request(body: dict[str, Any], host: str, port: int, room: int) -> dict[str, Any]:
    """The request both SGLang engines get in a P/D pair."""
    request = copy.deepcopy(body)
    request.update({"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room})
    return request


MAX_DEPTH: Final = 64
"""Deepest nesting of a request body: far beyond any real request, far below a stack."""
ROUTER_FIELDS: Final = ("kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room")
"""Fields the router sets on the engines' requests; a client's would misroute the KV cache."""
UTF8: Final = frozenset({"utf-8", "ascii"})


def parse_body(raw: bytes, charset: str | None) -> tuple[object, tuple[int, str] | None]:
    """The JSON a client sent, or an (HTTP status, message) saying why it cannot be read."""
    if charset:
        try:
            name = codecs.lookup(charset).name
        except LookupError:
            name = ""
        if name not in UTF8:
            return None, (415, f"unsupported charset {charset!r}: send JSON as UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, (400, f"the request body is not valid UTF-8 (byte {error.start})")
    try:
        body = json.loads(text)
    except RecursionError:
        return None, (400, f"the request body is nested deeper than {MAX_DEPTH} levels")
    except ValueError as error:  # also an integer literal longer than Python converts
        return None, (400, f"the request body is not valid JSON: {error}")
    if levels(body) + 1 > MAX_DEPTH:  # the body itself is the first level
        return None, (400, f"the request body is nested deeper than {MAX_DEPTH} levels")
    return body, None


def validate(body: object, kind: str, served_model_name: str | None) -> tuple[int, str] | None:
    """An (HTTP status, message) for a request the router must refuse, or None."""
    if not isinstance(body, dict):
        return 400, "the request body must be a JSON object"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return 400, "model is required"
    if served_model_name is not None and model != served_model_name:
        return 404, f"The model `{model}` does not exist."
    problem = _messages_problem(body.get("messages")) if kind == "chat" else None
    if kind != "chat":
        problem = _prompt_problem(body.get("prompt"))
    if problem:
        return 400, problem
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        return 400, f"stream must be a boolean, got {stream!r}"
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and stream):
        return 400, "stream_options must be an object, and only with stream: true"
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            return 400, f"{name} must be a positive integer, got {limit!r}"
    owned = [name for name in ROUTER_FIELDS if name in body]
    if owned:
        return 400, f"{', '.join(owned)} is set by the router; remove it from the request"
    return None


def _messages_problem(messages: object) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "messages is required and must be a non-empty list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{i}] must be an object with a string role"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"messages[{i}].content must be a string or a list of content parts"
    return None


def _prompt_problem(prompt: object) -> str | None:
    """A prompt is a non-empty string, token ids, or a list of either (vLLM's forms)."""
    if isinstance(prompt, str):
        return None if prompt else "prompt is required"
    if not isinstance(prompt, list) or not prompt:
        return "prompt is required: a string, a list of strings, or token ids"
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None
    for i, part in enumerate(prompt):
        tokens = (
            isinstance(part, list)
            and part
            and all(isinstance(t, int) and not isinstance(t, bool) for t in part)
        )
        if not (isinstance(part, str) and part) and not tokens:
            return f"prompt[{i}] must be a non-empty string or a non-empty list of token ids"
    return None
