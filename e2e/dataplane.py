"""Real engine simulators and routers as processes on loopback addresses, for data-plane tests."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from disagg.demo.procs import LOG_DIR, Proc, long_prompt, start

__all__ = ["LOG_DIR", "Proc", "long_prompt", "start"]


def engine(
    name: str, host: str, role: str, *extra: str, port: int = 8000, time_scale: float = 0.05
) -> Proc:
    return start(
        name,
        "sim",
        "engine",
        "--role",
        role,
        "--host",
        host,
        "--port",
        str(port),
        "--kv-port",
        "5600",
        "--served-model-name",
        "m",
        "--time-scale",
        str(time_scale),
        *extra,
        url=f"http://{host}:{port}",
    )


def router(
    name: str, host: str, prefill: list[Proc], decode: list[Proc], *extra: str, port: int = 8000
) -> Proc:
    args = ["router", "--host", host, "--port", str(port), "--served-model-name", "m"]
    if prefill:
        args += ["--prefill", *(p.url for p in prefill)]
    args += ["--decode", *(d.url for d in decode), *extra]
    return start(name, *args, url=f"http://{host}:{port}")


@dataclass
class StreamResult:
    status: int
    text: str = ""
    chunks: int = 0
    gaps: list[float] = field(default_factory=list)
    path: str | None = None
    error: str | None = None
    first_token_at: float | None = None


async def stream_completion(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, chat: bool = False
) -> StreamResult:
    """Send one streaming request and time the arrival of each event."""
    body: dict[str, Any] = {"model": "m", "max_tokens": max_tokens, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with session.post(url + path, json=body) as response:
        result = StreamResult(status=response.status, path=response.headers.get("X-Disagg-Path"))
        if response.status != 200:
            result.error = await response.text()
            return result
        last: float | None = None
        buffer = b""
        async for data in response.content.iter_any():
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                payload = event.removeprefix(b"data: ").strip()
                if payload == b"[DONE]":
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = json.dumps(chunk["error"])
                    continue
                now = time.monotonic()
                if last is not None:
                    result.gaps.append(now - last)
                else:
                    result.first_token_at = now
                last = now
                for choice in chunk.get("choices", []):
                    result.text += (
                        choice.get("text") or choice.get("delta", {}).get("content") or ""
                    )
                    result.chunks += 1
        return result


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def run(coro: Any) -> Any:
    return asyncio.run(coro)
