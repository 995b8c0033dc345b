"""Generated client requests against a real router and real engine simulators.

A seeded generator starts from a valid completion or chat request and mutates one to three
things: a field's value (pools of wrong types, bounds, empty and huge values), a message or
prompt part, a field the router sets itself, the raw body (truncated, bad UTF-8, a BOM,
trailing garbage, nesting), or the request line and headers (method, path, content type,
charset). Every request is judged by what its client sees:

* **no 5xx**: a client's mistake is a 4xx (the engines are healthy, so a 5xx is the
  router's or the engines' fault);
* **no hang**: an answer within ``DEADLINE`` seconds;
* **no late error**: a 200 stream ends with ``[DONE]`` and carries no error event (a mistake
  is refused before the first byte);
* **an OpenAI-shaped error**: a 4xx from ``/v1/*`` is ``{"error": {"message", "code"}}``.

``e2e/test_router_fuzz.py`` asserts on the report; ``bench/fuzz_router.py`` prints it for any
seed and size.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

DEADLINE = 30.0
VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2, 1.5, -0.5, 2**31, 2**63, -(2**63), 10**30, 1e308, "",
    " ", "x", "8", "yes", "m", "\u0000", "\ud7ff", "é" * 3, "x" * 10_000, [], [None], [1],
    [""], ["x"], [[1, 2]], [{}], {}, {"a": 1}, {"include_usage": True}, {"type": "text"},
]  # fmt: skip
FIELDS = (
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "temperature", "top_p", "n", "stop", "logprobs", "seed", "user",
    "kv_transfer_params", "bootstrap_room", "bootstrap_host", "bootstrap_port", "unknown",
)  # fmt: skip
MESSAGE_VALUES: list[Any] = [
    None, 1, "hi", [], {}, {"role": "user"}, {"content": "hi"}, {"role": 1, "content": "hi"},
    {"role": "user", "content": None}, {"role": "user", "content": []},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "user", "content": [{"type": "image_url"}]}, {"role": "user", "content": [1]},
    {"role": "tool", "content": "x", "tool_call_id": 1}, {"role": "bogus", "content": "x"},
]  # fmt: skip
CONTENT_TYPES = (
    "application/json", "application/json; charset=utf-8", "application/json; charset=latin-1",
    "application/json; charset=nope", "text/plain", "", "application/x-www-form-urlencoded",
)  # fmt: skip


@dataclass(frozen=True)
class Attempt:
    """One generated request, as sent."""

    method: str
    path: str
    content_type: str
    body: bytes
    mutations: tuple[str, ...]


@dataclass
class Report:
    seed: int
    requests: int
    seconds: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)
    server_errors: list[tuple[Attempt, int, str]] = field(default_factory=list)
    hangs: list[Attempt] = field(default_factory=list)
    late_errors: list[tuple[Attempt, str]] = field(default_factory=list)
    unshaped_errors: list[tuple[Attempt, int, str]] = field(default_factory=list)


def _valid(rng: random.Random) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": "m", "max_tokens": rng.choice((1, 2, 4)), "stream": False}
    if rng.random() < 0.5:
        body["stream"] = True
    words = " ".join(rng.choice(("tell", "me", "more", "about", "it")) for _ in range(40))
    if rng.random() < 0.5:
        return "/v1/completions", {**body, "prompt": words * rng.choice((1, 4))}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": words}]}


def _mutate_fields(rng: random.Random, body: dict[str, Any], notes: list[str]) -> None:
    choice = rng.random()
    if choice < 0.45:
        name = rng.choice(FIELDS)
        value = copy.deepcopy(rng.choice(VALUES))
        body[name] = value
        notes.append(f"{name}={_short(value)}")
    elif choice < 0.6:
        name = rng.choice(sorted(body))
        del body[name]
        notes.append(f"-{name}")
    elif choice < 0.8 and isinstance(body.get("messages"), list):
        message = copy.deepcopy(rng.choice(MESSAGE_VALUES))
        body["messages"] = [*body["messages"], message][-rng.choice((1, 2)) :]
        notes.append(f"messages+={_short(message)}")
    else:
        value = rng.choice(([1, 2, 3], [""], ["a", 1], [[1]], "", [], ["x"] * 3))
        body["prompt"] = value
        notes.append(f"prompt={_short(value)}")


def _mutate_raw(rng: random.Random, raw: bytes, notes: list[str]) -> bytes:
    kind = rng.choice(("truncate", "bad-utf8", "bom", "garbage", "nest", "empty", "number"))
    notes.append(kind)
    if kind == "truncate":
        return raw[: rng.randrange(len(raw))]
    if kind == "bad-utf8":
        cut = rng.randrange(len(raw))
        return raw[:cut] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80")) + raw[cut:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + raw
    if kind == "garbage":
        return raw + rng.choice((b"x", b"}", b"\x00", b" {}"))
    if kind == "nest":
        depth = rng.choice((63, 65, 500, 5000))
        return raw[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == "empty":
        return b""
    return raw[:-1] + b', "n": ' + b"9" * rng.choice((20, 400, 5000)) + b"}"


def generate(rng: random.Random) -> Attempt:
    """One request, valid or mutated."""
    path, body = _valid(rng)
    notes: list[str] = []
    method, content_type = "POST", "application/json"
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        _mutate_fields(rng, body, notes)
    raw = json.dumps(body).encode()
    if rng.random() < 0.2:
        raw = _mutate_raw(rng, raw, notes)
    if rng.random() < 0.1:
        content_type = rng.choice(CONTENT_TYPES)
        notes.append(f"content-type={content_type!r}")
    if rng.random() < 0.04:
        method, path = rng.choice((("GET", path), ("PUT", path), ("POST", "/v1/nope")))
        notes.append(f"{method} {path}")
    return Attempt(method, path, content_type, raw, tuple(notes))


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


async def _send(session: aiohttp.ClientSession, url: str, attempt: Attempt, report: Report) -> None:
    headers = {"Content-Type": attempt.content_type} if attempt.content_type else {}
    try:
        async with asyncio.timeout(DEADLINE):
            async with session.request(
                attempt.method, url + attempt.path, data=attempt.body, headers=headers
            ) as response:
                status, payload = response.status, await response.read()
    except TimeoutError:
        report.hangs.append(attempt)
        return
    report.statuses[status] = report.statuses.get(status, 0) + 1
    text = payload.decode("utf-8", "replace")
    if status >= 500:
        report.server_errors.append((attempt, status, text[:300]))
    elif status == 200 and text.startswith("data:"):
        if '"error"' in text or not text.rstrip().endswith("data: [DONE]"):
            report.late_errors.append((attempt, text[-300:]))
    elif status >= 400 and attempt.path.startswith("/v1/") and attempt.path != "/v1/nope":
        try:
            error = json.loads(text)["error"]
            shaped = isinstance(error["message"], str) and error["code"] == status
        except (ValueError, KeyError, TypeError):
            shaped = False
        if not shaped and status != 405:
            report.unshaped_errors.append((attempt, status, text[:300]))


async def fuzz(url: str, seed: int, requests: int, concurrency: int = 16) -> Report:
    """Send ``requests`` generated requests to the router at ``url``, ``concurrency`` at once."""
    rng = random.Random(seed)
    attempts = [generate(rng) for _ in range(requests)]
    report = Report(seed, requests)
    started = time.monotonic()
    queue: asyncio.Queue[Attempt] = asyncio.Queue()
    for attempt in attempts:
        queue.put_nowait(attempt)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:

        async def worker() -> None:
            while not queue.empty():
                await _send(session, url, queue.get_nowait(), report)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.seconds = time.monotonic() - started
    return report
