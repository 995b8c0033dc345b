"""Real engine simulators and routers as processes on loopback addresses, for data-plane tests."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from disagg.autoscale.sizing import Buckets, quantile
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


async def histogram(session: aiohttp.ClientSession, url: str, name: str) -> Buckets:
    """One histogram an engine exports, as cumulative (upper bound, count) pairs."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return [
                (float(s.labels["le"]), s.value)
                for s in family.samples
                if s.name.endswith("_bucket")
            ]
    raise AssertionError(f"{url} exports no {name}")


def histogram_p99(after: Buckets, before: Buckets) -> float:
    """The p99 of what was observed between two scrapes, as histogram_quantile computes it."""
    counts = dict(before)
    value = quantile([(bound, count - counts.get(bound, 0.0)) for bound, count in after], 0.99)
    assert value is not None, "nothing was observed between the scrapes"
    return value


async def host_lag_p99(session: aiohttp.ClientSession, url: str) -> float:
    """How late the host woke the simulator's loop (wall seconds, p99 over its life)."""
    value = quantile(await histogram(session, url, "disagg_sim_host_lag_seconds"), 0.99)
    return value or 0.0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def run(coro: Any) -> Any:
    return asyncio.run(coro)
