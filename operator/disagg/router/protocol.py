"""The request shapes of the P/D protocols (pure), exactly as the engines expect them.

vLLM NIXL (pull): the prefill engine gets a copy of the request with ``max_tokens: 1``,
``stream: false``, no ``stream_options``, and ``kv_transfer_params`` asking for a remote
decode; the decode engine then gets the original request with the ``kv_transfer_params``
the prefill engine returned, copied in unchanged. SGLang: both engines get the same request
with ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` added, at the same time.
"""

from __future__ import annotations

import copy
from typing import Any, Final

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


def validate(body: object, kind: str, served_model_name: str | None) -> tuple[int, str] | None:
    """An (HTTP status, message) for a request the router must refuse, or None."""
    if not isinstance(body, dict):
        return 400, "the request body must be a JSON object"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return 400, "model is required"
    if served_model_name is not None and model != served_model_name:
        return 404, f"The model `{model}` does not exist."
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return 400, "messages is required and must be a non-empty list"
    elif "prompt" not in body or body["prompt"] in ("", [], None):
        return 400, "prompt is required"
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        return 400, f"stream must be a boolean, got {stream!r}"
    return None
