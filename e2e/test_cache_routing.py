"""Cache-aware routing with real router and engine-simulator processes: a conversation's
follow-up turns are prefilled on the decode engine that holds them, and a router restart
loses only its record of what it sent where, never a request."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import aiohttp

from dataplane import Proc, engine, router, run, stream_completion

SYSTEM = "Answer as an SRE would: precise, brief, with the command to run. " * 10


async def _turn(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> str:
    body = {"model": "m", "messages": messages, "max_tokens": 24}
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        answer = json.loads(await response.read())["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": answer})
        return response.headers["X-Disagg-Path"]


def _conversation(front: Proc, messages: list[dict[str, str]], *questions: str) -> list[str]:
    async def talk() -> list[str]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            paths = []
            for question in questions:
                messages.append({"role": "user", "content": question})
                paths.append(await _turn(session, front.url, messages))
            return paths

    result: list[str] = run(talk())
    return result


async def _until_decoding(front: Proc, count: int) -> None:
    """Wait (up to 30 s) until the router has ``count`` requests in flight on decode."""
    deadline = time.monotonic() + 30
    while True:
        view = await asyncio.to_thread(front.get, "/debug/endpoints")
        if sum(e["in_flight"] for e in view["decode"]) >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} streams reached decode: {view}"
        await asyncio.sleep(0.02)


def _cached_blocks(front: Proc) -> dict[str, Any]:
    view = front.get("/debug/endpoints")
    return {e["url"]: e["cached_blocks"] for e in view["decode"]}


def test_follow_ups_prefill_locally_and_a_router_restart_loses_no_request() -> None:
    prefill = [engine("ca-prefill", "127.47.1.1", "prefill")]
    decode = [engine(f"ca-decode-{i}", f"127.47.2.{i}", "decode") for i in (1, 2)]
    procs: list[Proc] = [*prefill, *decode]
    try:
        front = router("ca-router", "127.47.0.1", prefill, decode)  # the defaults: cache-aware
        procs.append(front)
        messages = [{"role": "system", "content": SYSTEM}]
        first = "Why does TPOT p99 spike when a long prompt arrives? " * 8
        paths = _conversation(front, messages, first, "And chunked prefill?", "When to split?")
        assert paths == ["disaggregated", "local-prefill", "local-prefill"]
        view = front.get("/debug/endpoints")
        assert view["policy"] == "cache-aware" and "characters per token" in view["tokenizer"]
        assert sorted(_cached_blocks(front).values())[0] == 0, "one decode engine holds it all"

        async def restart_under_load() -> list[Any]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                streams = [
                    asyncio.create_task(
                        stream_completion(session, front.url, f"stream {i} " * 100, 1500)
                    )
                    for i in range(12)
                ]
                await _until_decoding(front, len(streams))
                assert not any(s.done() for s in streams)
                front.process.send_signal(signal.SIGTERM)
                results = await asyncio.gather(*streams)
                code = await asyncio.to_thread(front.process.wait, 60)
                return [code, *results]

        code, *results = run(restart_under_load())
        assert code == 0
        broken = [r for r in results if r.status != 200 or r.error or r.chunks != 1500]
        assert not broken, [(r.status, r.error, r.chunks) for r in broken[:3]]

        front = router("ca-router-2", "127.47.0.1", prefill, decode)
        procs.append(front)
        assert set(_cached_blocks(front).values()) == {0}, "the record starts empty"
        again = _conversation(front, messages, "Summarise the above in one line.", "Thanks!")
        assert again[0] in ("disaggregated", "skipped"), "the affinity is gone, not the request"
        assert again[1] == "local-prefill", "and is learned again from the next turn"
    finally:
        for proc in reversed(procs):
            proc.stop()
