"""``disagg simulate``: replay traffic through a simulated fleet and report what a user sees.

Prints a summary table (or JSON with ``--json``); with ``--out DIR`` also writes
``summary.json`` and ``timeline.png`` (replicas, latency p99 against the SLOs, load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Final

from disagg.autoscale.budget import percent, standing
from disagg.extras import require_tools
from disagg.perf import GPUS, MODELS, NETWORKS
from disagg.perf.fitted import LATENCY_MODELS
from disagg.sim.fleet import simulate
from disagg.sim.fleet_policies import SloPolicy
from disagg.sim.fleet_types import PoolName
from disagg.sim.results import length_stats
from disagg.sim.scenario import POLICIES, SHAPES, Scenario, build, requests_for, summarize
from disagg.sim.traffic import MAX_SPAN_SECONDS, WORKLOADS, Request, load_trace

MIN_INTERVAL_SECONDS: Final = 1.0
"""The shortest interval between policy decisions: autoscaling.interval's own bound (a
millisecond interval ticks the policy a thousand times a simulated second)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``disagg simulate`` to the ``disagg`` parser."""
    parser = sub.add_parser(
        "simulate",
        help="run a deployment and an autoscaling policy against traffic, in simulated time",
    )
    d = Scenario()
    add = parser.add_argument
    add("--model", default=d.model, help="model profile: " + ", ".join(MODELS))
    add("--gpu", default=d.gpu, help="GPU profile: " + ", ".join(GPUS))
    add("--network", default=d.network, choices=sorted(NETWORKS))
    add("--mode", default=d.mode, choices=("disaggregated", "colocated"))
    add("--prefill-tp", type=int, default=d.prefill_tp)
    add("--decode-tp", type=int, default=d.decode_tp, help="TP of decode (or colocated) engines")
    add("--prefill-replicas", type=int, default=d.prefill_replicas)
    add("--decode-replicas", type=int, default=d.decode_replicas)
    add("--max-replicas", type=int, default=d.max_replicas, help="upper bound of each pool")
    add("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    add("--max-num-seqs", type=int, default=d.max_num_seqs)
    add("--workload", default=d.workload, choices=sorted(WORKLOADS))
    add("--rate", type=float, default=d.rate, help="base requests per second")
    add("--duration", type=float, default=d.duration, help="simulated seconds of traffic")
    add("--shape", default=d.shape, choices=SHAPES, help="how the rate moves over the run")
    add("--trace", type=Path, help="replay a CSV/JSONL trace instead of synthetic traffic")
    add("--policy", default=d.policy, choices=POLICIES)
    add("--provisioning-delay", type=float, default=d.provisioning_delay, help="seconds")
    add("--interval", type=float, default=d.interval, help="seconds between policy decisions")
    add("--ttft", type=float, default=d.ttft, help="TTFT SLO, seconds")
    add("--tpot", type=float, default=d.tpot, help="TPOT SLO, seconds")
    add("--seed", type=int, default=d.seed)
    add("--latency", default=d.latency, choices=LATENCY_MODELS)
    add(
        "--pd-threshold",
        type=int,
        default=d.pd_threshold,
        help="shorter prompts skip the prefill pool (the router's prefillThresholdTokens)",
    )
    add(
        "--offload-max-tokens",
        type=int,
        default=d.offload_max_tokens,
        help="the router's prefillOffload.maxPromptTokens (0: no offloading)",
    )
    add(
        "--offload-wait-fraction",
        type=float,
        default=d.offload_wait_fraction,
        help="the router's prefillOffload.waitFraction, of the TTFT SLO",
    )
    add(
        "--offload-per-decode",
        type=int,
        default=d.offload_per_decode,
        help="the router's prefillOffload.perDecodeEngine",
    )
    add("--out", type=Path, help="directory for summary.json and timeline.png")
    add("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=cmd_simulate)


def scenario_from(args: argparse.Namespace) -> Scenario:
    names = {f.name for f in dataclasses.fields(Scenario)}
    return Scenario(**{k: v for k, v in vars(args).items() if k in names})


def check(scenario: Scenario) -> list[str]:
    """Every problem with the numbers of a scenario, one line each."""
    problems = []
    for name in ("prefill_tp", "decode_tp", "max_replicas", "max_num_batched_tokens"):
        if getattr(scenario, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1")
    if scenario.max_num_seqs < 1:
        problems.append("--max-num-seqs must be at least 1")
    for name in ("pd_threshold", "offload_max_tokens"):
        if getattr(scenario, name) < 0:
            problems.append(f"--{name.replace('_', '-')} must be >= 0")
    if scenario.offload_per_decode < 1:
        problems.append("--offload-per-decode must be at least 1")
    if not 0 < scenario.offload_wait_fraction < math.inf:
        problems.append("--offload-wait-fraction must be a positive finite number")
    for name in ("prefill_replicas", "decode_replicas", "provisioning_delay"):
        if not getattr(scenario, name) >= 0:  # NaN too
            problems.append(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("rate", "duration", "interval", "ttft", "tpot"):
        if not getattr(scenario, name) > 0:
            problems.append(f"--{name} must be greater than zero")
    for name in ("rate", "duration", "interval", "provisioning_delay"):
        if math.isinf(getattr(scenario, name)):
            problems.append(f"--{name.replace('_', '-')} must be finite")
    if math.isfinite(scenario.duration) and scenario.duration > MAX_SPAN_SECONDS:
        problems.append(
            f"--duration must be at most {MAX_SPAN_SECONDS:g} seconds "
            f"({MAX_SPAN_SECONDS / 86400:g} days), got {scenario.duration:g}"
        )
    if 0 < scenario.interval < MIN_INTERVAL_SECONDS:
        problems.append(
            f"--interval must be at least {MIN_INTERVAL_SECONDS:g} second, as "
            f"autoscaling.interval must, got {scenario.interval:g}"
        )
    return problems


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.out is not None:
        require_tools("disagg simulate --out", ("matplotlib",))
    scenario = scenario_from(args)
    problems = check(scenario)
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 1
    try:
        config = build(scenario)
        requests = _requests(args, scenario)
    except (KeyError, ValueError, OSError) as error:
        message = error.args[0] if isinstance(error, KeyError) else str(error)
        print(f"error: {message}", file=sys.stderr)
        return 1
    started = time.process_time()
    result = simulate(config, requests)
    cpu = time.process_time() - started
    summary = summarize(scenario, result)
    values = {**summary.values, "cpuSeconds": round(cpu, 2)}
    if isinstance(config.policy, SloPolicy):
        values["budgetAsCounted"] = counted_budgets(config.policy, result.duration)
    if args.trace is not None:  # the synthetic-traffic settings were not used
        described = {k: v for k, v in values["scenario"].items() if k not in SYNTHETIC_ONLY}
        values["scenario"] = {**described, "trace": trace_stats(args.trace.name, requests)}
    if args.out is not None:
        from disagg.sim.plots import write_timeline

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(
            json.dumps({**values, "latencyByMinute": summary.latency}, indent=2) + "\n"
        )
        write_timeline(scenario, result, summary, args.out / "timeline.png")
    if args.json:
        print(json.dumps(values, indent=2))
    else:
        print(table(values), end="")
        if args.out is not None:
            print(f"wrote {args.out / 'summary.json'} and {args.out / 'timeline.png'}")
    return 0


def _requests(args: argparse.Namespace, scenario: Scenario) -> list[Request]:
    if args.trace is None:
        return requests_for(scenario)
    if not args.trace.exists():
        raise ValueError(f"{args.trace}: no such file")
    requests = load_trace(args.trace)
    if not requests:
        raise ValueError(f"{args.trace}: no requests in it")
    return requests


SYNTHETIC_ONLY = frozenset({"workload", "rate", "duration", "shape", "seed"})


def trace_stats(name: str, requests: list[Request]) -> dict[str, Any]:
    """What a replayed trace holds: its name, span, rate and token statistics."""
    span = requests[-1].arrival - requests[0].arrival if len(requests) > 1 else 0.0

    def stats(values: list[int]) -> dict[str, float]:
        mean, p99 = length_stats(values)
        return {"mean": round(mean, 1), "p99": p99}

    return {
        "name": name,
        "requests": len(requests),
        "durationSeconds": round(span, 1),
        "rate": round((len(requests) - 1) / span, 4) if span > 0 else 0.0,
        "promptTokens": stats([r.prompt_tokens for r in requests]),
        "outputTokens": stats([r.output_tokens for r in requests]),
    }


def _traffic_row(s: dict[str, Any]) -> str:
    trace = s.get("trace")
    if trace is None:
        return f"{s['workload']} {s['shape']} at {s['rate']:g} req/s for {s['duration']:g}s"
    return (
        f"trace {trace['name']}: {trace['requests']} requests over "
        f"{trace['durationSeconds']:g}s ({trace['rate']:g} req/s), prompt tokens mean "
        f"{trace['promptTokens']['mean']:g} (p99 {trace['promptTokens']['p99']}), output "
        f"mean {trace['outputTokens']['mean']:g} (p99 {trace['outputTokens']['p99']})"
    )


def _requests_row(values: dict[str, Any]) -> str:
    rejected = values.get("rejected", 0)
    refused = (
        f", {rejected} refused: longer than the model's context or an engine's KV cache"
        if rejected
        else ""
    )
    return f"{values['requests']} ({values['finished']} finished{refused})"


def counted_budgets(policy: SloPolicy, end: float) -> dict[str, dict[str, float | None]]:
    """Each SLO's budget as the operator would show it in status at the end of the run: the
    policy's own count from the engines' histograms, for the phase's pool (in a split
    deployment, the prefill engines' TTFT of the prompts they served)."""
    counted = {}
    phases: tuple[tuple[PoolName, str], ...] = (("prefill", "ttft"), ("decode", "tpot"))
    for phase, slo in phases:
        budget = standing(policy.memory(phase).ledger, end, policy.behavior.slo_window)
        attainment = budget.attainment
        at_least = budget.attainment_at_least
        counted[slo] = {
            "requests": round(budget.requests),
            "attainment": None if attainment is None else round(attainment, 4),
            "attainmentAtLeast": None if at_least is None else round(at_least, 4),
            "remaining": round(budget.remaining, 4),
            "remainingAtLeast": round(budget.remaining_at_least, 4),
        }
    return counted


def _budget_row(counted: dict[str, dict[str, float | None]]) -> str:
    def one(slo: str) -> str:
        b = counted[slo]
        attainment, remaining = b["attainment"], b["remaining"]
        if attainment is None or remaining is None:
            return f"{slo.upper()} none counted"
        return (
            f"{slo.upper()} {percent(attainment, 2, b['attainmentAtLeast'])} of "
            f"{b['requests']:.0f}, {percent(remaining, 0, b['remainingAtLeast'])} left"
        )

    return f"{one('ttft')}; {one('tpot')}"


def table(values: dict[str, Any]) -> str:
    s, a = values["scenario"], values["attainment"]
    pools = (
        f"decode TP{s['decode_tp']}"
        if s["mode"] == "colocated"
        else f"prefill TP{s['prefill_tp']} + decode TP{s['decode_tp']}"
    )

    def ms(group: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v * 1000:.0f}" for v in group.values())

    by_pool = ", ".join(f"{pool} {hours:.2f}" for pool, hours in values["gpuHoursByPool"].items())
    rows = [
        ("deployment", f"{s['mode']}, {pools}, {s['model']} on {s['gpu']}, {s['network']}"),
        ("traffic", _traffic_row(s)),
        ("policy", f"{s['policy']} (provisioning delay {s['provisioning_delay']:g}s)"),
        ("requests", _requests_row(values)),
        ("SLO attainment", f"{a['both']:.1%} (TTFT {a['ttft']:.1%}, TPOT {a['tpot']:.1%})"),
        *(
            [("budget (counted)", _budget_row(values["budgetAsCounted"]))]
            if "budgetAsCounted" in values
            else []
        ),
        ("goodput", f"{values['goodput']:.2f} req/s, {values['goodputPerGpu']:.3f} per GPU"),
        ("TTFT p50/p90/p99", ms(values["ttft"]) + " ms"),
        ("TPOT p50/p90/p99", ms(values["tpot"]) + " ms"),
        ("GPU-hours", f"{values['gpuHours']:.2f} (mean {values['meanGpus']:.1f} GPUs): {by_pool}"),
        ("scaling actions", str(values["scalingActions"])),
        ("peak replicas", ", ".join(f"{k} {v}" for k, v in values["peakReplicas"].items())),
        ("simulated in", f"{values['cpuSeconds']:.1f} CPU seconds"),
    ]
    return "".join(f"{k:18} {v}\n" for k, v in rows)
