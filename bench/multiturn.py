"""Multi-turn chat through real router and engine-simulator processes: what cache-aware
routing and local prefill do to follow-up turns, against always-remote prefill and the
length threshold, and what they cost on single-shot traffic with no shared prefix.

Conversations of 3-10 turns arrive as a Poisson process; each starts with one of two
shared system prompts (a RAG-style template) and a first question, then alternates the
engine's own answer and a short follow-up after a think time, so the context grows turn by
turn. Every policy gets the same seeded traffic against fresh engines (one prefill, two
decode; Llama-3.1-8B on H100, prefix caching on as in vLLM) and its own router process:

* ``always-remote``: every request through the prefill pool (what vLLM's example proxy does);
* ``length-threshold``: prompts under 256 tokens skip prefill (least outstanding requests);
* ``cache-aware``: engines chosen by the blocks the router sent them; the pd threshold applies
  to the uncached suffix; no local prefill beyond it;
* ``cache-aware+local``: the defaults: a decode engine holding all but 512 tokens (and half
  the prompt) prefills the request itself.

Then single-shot traffic (unique prompts of 500-4,000 tokens at 70% of the prefill engine)
under ``least-loaded`` and under the defaults. Latencies are in simulated seconds (wall time over the time scale); KV bytes are
what the decode engines' ``vllm:nixl_bytes_transferred`` counted (the model's bytes).

    .venv/bin/python bench/multiturn.py [--seed 1] [--seconds 180] [--rate 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
from dataplane import Proc, engine, router

POLICIES = {
    "always-remote": ("--policy", "least-outstanding", "--pd-threshold", "0"),
    "length-threshold": ("--policy", "least-outstanding", "--pd-threshold", "256"),
    "cache-aware": ("--policy", "cache-aware", "--local-prefill-max-tokens", "0"),
    "cache-aware+local": ("--policy", "cache-aware"),
}
SINGLE_SHOT = {
    "least-loaded": POLICIES["length-threshold"],
    "defaults": POLICIES["cache-aware+local"],
}
WORDS = (
    "cache", "prefill", "decode", "token", "batch", "engine", "request", "stream", "router",
    "model", "layer", "tensor", "memory", "network", "latency", "queue", "replica", "pool",
    "prompt", "answer", "context", "window", "block", "hash", "system", "user", "policy",
)  # fmt: skip


def _text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens (four characters each) of text no other call repeats."""
    words: list[str] = [f"{rng.getrandbits(48):012x}"]
    while sum(len(w) + 1 for w in words) < 4 * tokens:
        words.append(rng.choice(WORDS))
    return " ".join(words)[: 4 * tokens]


@dataclass(frozen=True)
class Turn:
    user: str
    max_tokens: int
    think_after: float
    """Simulated seconds before the next turn."""


@dataclass(frozen=True)
class Conversation:
    start: float
    system: str | None
    turns: tuple[Turn, ...]


def conversations(seed: int, seconds: float, rate: float) -> list[Conversation]:
    rng = random.Random(seed)
    systems = [_text(rng, 1000), _text(rng, 700)]
    out, t = [], rng.expovariate(rate)
    while t < seconds:
        turns = [
            Turn(_text(rng, rng.randint(200, 1000)), rng.randint(64, 256), rng.expovariate(1 / 4))
        ]
        turns += [
            Turn(_text(rng, rng.randint(30, 300)), rng.randint(64, 256), rng.expovariate(1 / 4))
            for _ in range(rng.randint(2, 9))
        ]
        out.append(Conversation(t, rng.choice(systems), tuple(turns)))
        t += rng.expovariate(rate)
    return out


PREFILL_TOKENS_PER_SECOND = 25_000
"""What one prefill engine of this profile computes (Llama-3.1-8B, H100, 1-8k-token prompts)."""
SINGLE_SHOT_LOAD = 0.7


def single_shots(seed: int, seconds: float) -> list[Conversation]:
    """Unique prompts of 500-4,000 tokens sharing no prefix, at 70% of the prefill engine
    (without shared prefixes nothing is cached, so the chat's request rate would swamp it)."""
    rng = random.Random(seed + 1)
    count = round(SINGLE_SHOT_LOAD * PREFILL_TOKENS_PER_SECOND * seconds / 2250)
    return [
        Conversation(
            rng.uniform(0, seconds),
            None,
            (Turn(_text(rng, rng.randint(500, 4000)), rng.randint(64, 256), 0.0),),
        )
        for _ in range(count)
    ]


@dataclass
class Sample:
    follow_up: bool
    ttft: float
    tpot: float | None
    path: str | None


@dataclass
class Outcome:
    samples: list[Sample] = field(default_factory=list)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


async def _turn(
    session: aiohttp.ClientSession,
    url: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    scale: float,
) -> tuple[Sample | None, str, str | None]:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "stream": True}
    started = time.monotonic()
    stamps: list[float] = []
    text: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            return None, "", f"HTTP {response.status}: {(await response.text())[:200]}"
        path = response.headers.get("X-Disagg-Path")
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return None, "", str(event["error"])[:200]
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    stamps.append(time.monotonic())
                    text.append(piece)
    if not stamps:
        return None, "", "no tokens"
    ttft = (stamps[0] - started) / scale
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) / scale if len(stamps) > 1 else None
    return Sample(False, ttft, tpot, path), "".join(text), None


async def _converse(
    session: aiohttp.ClientSession,
    url: str,
    chat: Conversation,
    scale: float,
    outcome: Outcome,
    t0: float,
) -> None:
    await asyncio.sleep(max(0.0, t0 + chat.start * scale - time.monotonic()))
    messages = [{"role": "system", "content": chat.system}] if chat.system else []
    for index, turn in enumerate(chat.turns):
        messages.append({"role": "user", "content": turn.user})
        try:
            sample, answer, error = await _turn(session, url, messages, turn.max_tokens, scale)
        except (aiohttp.ClientError, TimeoutError) as failure:
            sample, answer, error = None, "", repr(failure)
        if sample is None:
            outcome.failed += 1
            outcome.errors.append(error or "?")
            return
        sample.follow_up = index > 0
        outcome.samples.append(sample)
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(turn.think_after * scale)


async def drive(url: str, chats: Sequence[Conversation], scale: float) -> Outcome:
    outcome = Outcome()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(_converse(session, url, c, scale, outcome, t0) for c in chats))
        outcome.seconds = (time.monotonic() - t0) / scale
    return outcome


def _scrape(proc: Proc) -> dict[str, float]:
    totals: dict[str, float] = {}
    text = httpx.get(proc.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_hits_total",
                "vllm:nixl_bytes_transferred_sum",
            ):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_policy(
    name: str, flags: Sequence[str], chats: Sequence[Conversation], scale: float
) -> dict[str, Any]:
    procs: list[Proc] = []
    try:
        prefill = [engine(f"mt-{name}-p0", "127.45.0.2", "prefill", time_scale=scale)]
        decode = [
            engine(f"mt-{name}-d{i}", f"127.45.0.{3 + i}", "decode", time_scale=scale)
            for i in range(2)
        ]
        procs += prefill + decode
        front = router(f"mt-{name}-router", "127.45.0.1", prefill, decode, *flags)
        procs.append(front)
        outcome = asyncio.run(drive(front.url, chats, scale))
        engines = [_scrape(p) for p in prefill + decode]
        router_cpu = _cpu_seconds(front.process.pid)
    finally:
        for proc in reversed(procs):
            proc.stop()
    queries = sum(e.get("vllm:prefix_cache_queries_total", 0.0) for e in engines)
    hits = sum(e.get("vllm:prefix_cache_hits_total", 0.0) for e in engines)
    first = [s.ttft for s in outcome.samples if not s.follow_up]
    later = [s.ttft for s in outcome.samples if s.follow_up]
    tpots = [s.tpot for s in outcome.samples if s.tpot is not None]
    paths: dict[str, int] = {}
    for s in outcome.samples:
        paths[s.path or "?"] = paths.get(s.path or "?", 0) + 1
    return {
        "policy": name,
        "requests": len(outcome.samples),
        "failed": outcome.failed,
        "errors": outcome.errors[:3],
        "firstTtftP50": _pct(first, 0.5),
        "firstTtftP99": _pct(first, 0.99),
        "followTtftP50": _pct(later, 0.5),
        "followTtftP99": _pct(later, 0.99),
        "ttftP50": _pct(first + later, 0.5),
        "ttftP99": _pct(first + later, 0.99),
        "tpotP99": _pct(tpots, 0.99),
        "kvGB": sum(e.get("vllm:nixl_bytes_transferred_sum", 0.0) for e in engines[1:]) / 1e9,
        "hitRate": hits / queries if queries else 0.0,
        "rps": len(outcome.samples) / outcome.seconds if outcome.seconds else 0.0,
        "paths": paths,
        "followTtftP99ByPath": {
            path: _pct([s.ttft for s in outcome.samples if s.follow_up and s.path == path], 0.99)
            for path in paths
        },
        "followPaths": {
            path: sum(1 for s in outcome.samples if s.follow_up and s.path == path)
            for path in paths
        },
        "routerCpuSeconds": router_cpu,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.0f}"


def _row(r: dict[str, Any], single: bool) -> str:
    if single:
        return (
            f"{r['policy']:<18} {r['requests']:>5} {r['failed']:>3} | {_ms(r['ttftP50'])} {_ms(r['ttftP99'])} | "
            f"{_ms(r['tpotP99'])} | {r['kvGB']:7.1f} {r['hitRate']:6.1%} {r['rps']:6.2f}"
        )
    return (
        f"{r['policy']:<18} {r['requests']:>5} {r['failed']:>3} | {_ms(r['firstTtftP50'])} {_ms(r['firstTtftP99'])} | "
        f"{_ms(r['followTtftP50'])} {_ms(r['followTtftP99'])} | {_ms(r['tpotP99'])} | {r['kvGB']:7.1f} "
        f"{r['hitRate']:6.1%} {r['rps']:6.2f}  {r['paths']}"
    )


def verdicts(
    chat: dict[str, dict[str, Any]], single: dict[str, dict[str, Any]], tpot_slo: float
) -> list[tuple[str, bool]]:
    base, ours = chat["always-remote"], chat["cache-aware+local"]
    checks = [
        ("follow-up TTFT p99 cut by >= 50% vs always-remote", ours["followTtftP99"] <= 0.5 * base["followTtftP99"]),
        ("KV bytes moved cut by >= 50% vs always-remote", ours["kvGB"] <= 0.5 * base["kvGB"]),
        (f"TPOT p99 within the {tpot_slo * 1000:g} ms SLO", ours["tpotP99"] <= tpot_slo),
        ("first-turn TTFT p50 and p99 within 10% of always-remote",
         ours["firstTtftP50"] <= 1.1 * base["firstTtftP50"] and ours["firstTtftP99"] <= 1.1 * base["firstTtftP99"]),
        ("no failed request", all(r["failed"] == 0 for r in (*chat.values(), *single.values()))),
    ]  # fmt: skip
    a, b = single["least-loaded"], single["defaults"]
    for key in ("ttftP50", "ttftP99", "tpotP99", "kvGB"):
        checks.append((f"single-shot {key} within 5% of least-loaded", b[key] <= 1.05 * a[key]))
    checks.append(("single-shot requests/s within 5% of least-loaded", b["rps"] >= 0.95 * a["rps"]))
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--seconds", type=float, default=180.0, help="simulated seconds of arrivals"
    )
    parser.add_argument(
        "--rate", type=float, default=1.0, help="conversations per simulated second"
    )
    parser.add_argument(
        "--time-scale", type=float, default=0.5, help="wall seconds per simulated second"
    )
    parser.add_argument("--tpot-slo", type=float, default=0.05)
    parser.add_argument(
        "--only", nargs="+", choices=[*POLICIES, *(f"single:{k}" for k in SINGLE_SHOT)]
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chats = conversations(args.seed, args.seconds, args.rate)
    shots = single_shots(args.seed, args.seconds)
    wanted = set(args.only or [*POLICIES, *(f"single:{k}" for k in SINGLE_SHOT)])
    chat = {n: run_policy(n, f, chats, args.time_scale) for n, f in POLICIES.items() if n in wanted}
    single = {
        n: run_policy(n, f, shots, args.time_scale)
        for n, f in SINGLE_SHOT.items()
        if f"single:{n}" in wanted
    }
    if args.json:
        print(json.dumps({"chat": chat, "singleShot": single}, indent=2))
        return 0
    turns = sum(len(c.turns) for c in chats)
    print(
        f"multi-turn chat, seed {args.seed}: {len(chats)} conversations, {turns} turns over "
        f"{args.seconds:g} s (1 prefill + 2 decode, Llama-3.1-8B, H100; ms are simulated)"
    )
    print(f"{'policy':<18} {'reqs':>5} {'err':>3} | {'first TTFT p50':>7} {'p99':>7} | {'follow-up p50':>7} "
          f"{'p99':>7} | {'TPOT p99':>7} | {'KV GB':>7} {'hits':>6} {'req/s':>6}  paths")  # fmt: skip
    for r in chat.values():
        print(_row(r, single=False))
    if single:
        print(f"\nsingle-shot, no shared prefix: {len(shots)} requests")
        print(f"{'policy':<18} {'reqs':>5} {'err':>3} | {'TTFT p50':>7} {'p99':>7} | {'TPOT p99':>7} | "
              f"{'KV GB':>7} {'hits':>6} {'req/s':>6}")  # fmt: skip
        for r in single.values():
            print(_row(r, single=True))
    if len(chat) == len(POLICIES) and len(single) == len(SINGLE_SHOT):
        print()
        for what, ok in verdicts(chat, single, args.tpot_slo):
            print(f"  {'ok ' if ok else 'NO '} {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
