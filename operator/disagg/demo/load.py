"""The demo's and the closed-loop tests' load generator: open-loop streaming completions, and
what they saw (TTFT, each request's time per token, every inter-token gap, failures)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

from disagg.demo.procs import long_prompt

MODEL = "llama"


@dataclass
class LoadReport:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    """Each request's mean time per output token after the first."""
    gaps: list[float] = field(default_factory=list)
    """Every inter-token gap of every request: what an inter-token latency histogram holds,
    where one stalled step shows in full instead of averaged over a request's tokens."""
    errors: list[str] = field(default_factory=list)

    def add(self, other: LoadReport) -> None:
        """Count ``other``'s requests in this report too."""
        self.sent += other.sent
        self.ok += other.ok
        self.failed += other.failed
        self.ttfts += other.ttfts
        self.tpots += other.tpots
        self.gaps += other.gaps
        self.errors += other.errors

    def attainment(self, ttft_slo: float, tpot_slo: float) -> tuple[float, float]:
        """Fractions meeting the (wall-time, scaled) TTFT and TPOT SLOs."""
        ttft = sum(t <= ttft_slo for t in self.ttfts) / max(1, len(self.ttfts))
        tpot = sum(t <= tpot_slo for t in self.tpots) / max(1, len(self.tpots))
        return ttft, tpot


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    prompt_tokens: int,
    max_tokens: int,
    report: LoadReport,
    model: str = MODEL,
) -> None:
    body = {
        "model": model,
        "prompt": long_prompt(prompt_tokens),
        "max_tokens": max_tokens,
        "stream": True,
    }
    started = time.monotonic()
    first = last = None
    count = 0
    report.sent += 1
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                report.failed += 1
                report.errors.append(f"HTTP {response.status}: {(await response.text())[:200]}")
                return
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if b'"error"' in line:
                    report.failed += 1
                    report.errors.append(json.loads(line[6:])["error"]["message"][:200])
                    return
                now = time.monotonic()
                if last is not None:
                    report.gaps.append(now - last)
                first = first or now
                last = now
                count += 1
    except (aiohttp.ClientError, TimeoutError) as error:
        report.failed += 1
        report.errors.append(repr(error)[:200])
        return
    report.ok += 1
    if first is not None and last is not None:
        report.ttfts.append(first - started)
        if count > 1:
            report.tpots.append((last - first) / (count - 1))


async def drive(
    url: str,
    rate: float,
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    model: str = MODEL,
) -> LoadReport:
    """Open-loop load: ``rate`` requests per wall second for ``seconds``, then wait for all."""
    report = LoadReport()
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        tasks = []
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            tasks.append(
                asyncio.create_task(_one(session, url, prompt_tokens, max_tokens, report, model))
            )
            n += 1
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        await asyncio.gather(*tasks)
    return report
