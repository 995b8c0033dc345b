"""What the router adds: latency and throughput through it versus calling an engine directly.

Starts one engine simulator and one router (both real processes on loopback), then, for each
concurrency level, runs that many streaming clients for a fixed time against the engine and
against the router and prints one table. The router uses the decode-only path here (prompts
below its threshold), so the difference is the proxy's own cost; `--disaggregated` adds a
prefill engine and sends every request through the full P/D path instead.

    .venv/bin/python bench/router_overhead.py [--concurrency 10 50 100 200] [--seconds 5]

The client, router and engine share this machine's cores, so absolute numbers are a lower
bound of what the router can do on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
from dataplane import Proc, engine, router


@dataclass
class Run:
    latencies: list[float]
    ttfts: list[float]
    errors: int
    seconds: float

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    def pct(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _client(
    session: aiohttp.ClientSession, url: str, body: dict[str, object], until: float, run: Run
) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        first = None
        try:
            async with session.post(url + "/v1/completions", json=body) as response:
                if response.status != 200:
                    run.errors += 1
                    await response.read()
                    continue
                async for _ in response.content.iter_any():
                    if first is None:
                        first = time.monotonic()
        except (aiohttp.ClientError, TimeoutError):
            run.errors += 1
            continue
        run.latencies.append(time.monotonic() - started)
        run.ttfts.append((first or time.monotonic()) - started)


async def measure(url: str, concurrency: int, seconds: float, prompt: str, max_tokens: int) -> Run:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    run = Run([], [], 0, seconds)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        until = time.monotonic() + seconds
        await asyncio.gather(*(_client(session, url, body, until, run) for _ in range(concurrency)))
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement time per cell")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--disaggregated", action="store_true", help="route through a prefill engine too"
    )
    args = parser.parse_args()

    procs: list[Proc] = []
    try:
        decode = engine(
            "bench-engine", "127.44.0.2", "both", "--max-num-seqs", "1024", time_scale=0.02
        )
        procs.append(decode)
        prefill = []
        if args.disaggregated:
            prefill = [engine("bench-prefill", "127.44.0.3", "prefill", time_scale=0.02)]
            procs += prefill
        threshold = "0" if args.disaggregated else "100000"
        front = router("bench-router", "127.44.0.1", prefill, [decode], "--pd-threshold", threshold)
        procs.append(front)
        prompt = "abcd" * 128
        mode = (
            "disaggregated (prefill + decode)" if args.disaggregated else "decode-only (proxy cost)"
        )
        print(
            f"router overhead, {mode}, {args.seconds:g}s per cell, {args.max_tokens} tokens per request"
        )
        header = (
            f"{'streams':>7} | {'direct p50':>10} {'p99':>8} {'rps':>7} | {'router p50':>10} {'p99':>8} "
            f"{'rps':>7} | {'added p50':>9} {'p99':>8} | {'errors':>6}"
        )
        print(header)
        print("-" * len(header))
        for concurrency in args.concurrency:
            direct = asyncio.run(
                measure(decode.url, concurrency, args.seconds, prompt, args.max_tokens)
            )
            routed = asyncio.run(
                measure(front.url, concurrency, args.seconds, prompt, args.max_tokens)
            )
            d50, d99 = direct.pct(direct.latencies, 0.5), direct.pct(direct.latencies, 0.99)
            r50, r99 = routed.pct(routed.latencies, 0.5), routed.pct(routed.latencies, 0.99)
            print(
                f"{concurrency:>7} | {d50 * 1000:>8.1f}ms {d99 * 1000:>6.1f}ms {direct.rps:>7.1f} | "
                f"{r50 * 1000:>8.1f}ms {r99 * 1000:>6.1f}ms {routed.rps:>7.1f} | "
                f"{(r50 - d50) * 1000:>7.1f}ms {(r99 - d99) * 1000:>6.1f}ms | {direct.errors + routed.errors:>6}"
            )
        ttft = statistics.median(routed.ttfts) if routed.ttfts else float("nan")
        print(f"(last cell: router median time to first byte {ttft * 1000:.1f}ms)")
    finally:
        for proc in reversed(procs):
            proc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
