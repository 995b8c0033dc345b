"""``disagg plan``: should this workload be disaggregated, and with how many replicas.

Reads the flags (or a trace), runs the planner, and prints a table, JSON, or a ready
DisaggregatedModel manifest. Bad input ends with one clear line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from disagg.perf import GPUS, MODELS, NETWORKS, gpu_profile, kv_capacity_tokens, model_profile
from disagg.perf.fitted import LATENCY_MODELS, latency_model
from disagg.perf.roofline import EngineShape
from disagg.plan.manifest import to_manifest
from disagg.plan.model import Option, Plan, PlanRequest
from disagg.plan.planner import plan
from disagg.plan.traffic import LENGTH_SPREAD, PlanInputError, Traffic, from_trace, synthetic
from disagg.plan.verify import verify
from disagg.plan.windows import WINDOW
from disagg.sim.traffic import load_trace
from disagg.slo import Slo
from disagg.yamlio import dump


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``disagg plan`` to the ``disagg`` parser."""
    parser = sub.add_parser(
        "plan",
        help="decide colocated vs disaggregated and size the pools for a workload",
        description="Search colocated and disaggregated configurations with the fleet "
        "simulator and recommend the one with the most goodput per GPU.",
    )
    parser.add_argument("--model", help="model profile (see --list-models)")
    parser.add_argument("--gpu", help="GPU profile: " + ", ".join(sorted(GPUS)))
    parser.add_argument("--network", choices=sorted(NETWORKS), help="link the KV cache crosses")
    parser.add_argument("--rate", type=float, help="requests per second to serve")
    parser.add_argument("--input-tokens", type=int, help="mean prompt length")
    parser.add_argument("--output-tokens", type=int, help="mean output length")
    parser.add_argument("--ttft", type=float, help="TTFT SLO, seconds")
    parser.add_argument("--tpot", type=float, help="TPOT SLO, seconds per output token")
    parser.add_argument(
        "--attainment",
        type=float,
        default=0.99,
        help="fraction of requests meeting both SLOs (default 0.99: the SLOs are p99s)",
    )
    parser.add_argument(
        "--length-spread",
        type=float,
        default=LENGTH_SPREAD,
        help="lognormal sigma of generated prompt and output lengths (without --trace)",
    )
    parser.add_argument(
        "--arrival-cv",
        type=float,
        default=1.0,
        help="coefficient of variation of generated inter-arrival times (1 = Poisson)",
    )
    parser.add_argument(
        "--provisioning-delay",
        type=float,
        default=WINDOW,
        help="seconds a new replica takes to serve: the window whose peak is sized for",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="replay the trace (or newly drawn traffic of the same shape) through the whole "
        "recommended deployment and print predicted vs replayed attainment",
    )
    parser.add_argument(
        "--trace", type=Path, help="CSV/JSONL trace (arrival, input_tokens, output_tokens)"
    )
    parser.add_argument("--max-gpus", type=int, help="GPU budget of the deployment")
    parser.add_argument(
        "--latency",
        default="roofline",
        choices=LATENCY_MODELS,
        help="latency model: the roofline, or fitted coefficients",
    )
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    parser.add_argument("--name", help="metadata.name of the manifest (-o yaml)")
    parser.add_argument("--namespace", default="default", help="namespace of the manifest")
    parser.add_argument("--list-models", action="store_true", help="show the model profiles")
    parser.add_argument("--list-gpus", action="store_true", help="show the GPU profiles")
    parser.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.list_models or args.list_gpus:
        print(list_profiles(args.list_models, args.list_gpus), end="")
        return 0
    started = time.monotonic()
    try:
        request = build_request(args)
        with ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as executor:
            result = plan(request, executor)
            seconds = time.monotonic() - started
            replay = verify(result, request, executor) if args.verify else None
    except (PlanInputError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) else str(error)
        print(f"error: {message}", file=sys.stderr)
        return 1
    if args.output == "json":
        report = to_json(result, request)
        report["planSeconds"] = round(seconds, 2)
        if replay is not None:
            report["verify"] = replay.to_json()
        print(json.dumps(report, indent=2))
    elif args.output == "yaml":
        print(_yaml_comment(result) + dump(to_manifest(result, request, args.name, args.namespace)))
    else:
        print(to_table(result, request), end="")
        if replay is not None:
            print(replay.describe(), end="")
        print(f"planned in {seconds:.1f}s")
    return 0 if replay is None or replay.agrees else 3


def build_request(args: argparse.Namespace) -> PlanRequest:
    """The planner's input from the flags; PlanInputError names the first problem."""
    missing = [
        flag
        for flag, value in (
            ("--model", args.model),
            ("--gpu", args.gpu),
            ("--network", args.network),
        )
        + (
            ()
            if args.trace
            else (
                ("--rate", args.rate),
                ("--input-tokens", args.input_tokens),
                ("--output-tokens", args.output_tokens),
            )
        )
        + (("--ttft", args.ttft), ("--tpot", args.tpot))
        if value is None
    ]
    if missing:
        raise PlanInputError(f"missing {', '.join(missing)} (or use --list-models/--list-gpus)")
    for flag, value in (("--ttft", args.ttft), ("--tpot", args.tpot)):
        if not value > 0 or math.isinf(value):
            raise PlanInputError(f"{flag} must be a positive number of seconds, got {value}")
    if not 0 < args.attainment <= 1:
        raise PlanInputError(f"--attainment must be in (0, 1], got {args.attainment}")
    if not 10 <= args.provisioning_delay <= 3600:
        raise PlanInputError(
            f"--provisioning-delay must be 10-3600 seconds, got {args.provisioning_delay}"
        )
    if args.max_gpus is not None and args.max_gpus < 1:
        raise PlanInputError(f"--max-gpus must be at least 1, got {args.max_gpus}")
    model, gpu = model_profile(args.model), gpu_profile(args.gpu)
    latency = latency_model(args.latency)
    if args.latency != "roofline" and (model.name != "opt-13b" or gpu.name != "a100"):
        raise PlanInputError(f"--latency {args.latency} is fitted for opt-13b on a100 only")
    return PlanRequest(
        model,
        gpu,
        NETWORKS[args.network],
        _traffic(args),
        Slo(args.ttft, args.tpot, args.attainment),
        args.max_gpus,
        latency,
        args.provisioning_delay,
    )


def _traffic(args: argparse.Namespace) -> Traffic:
    if args.trace is None:
        return synthetic(
            args.rate,
            args.input_tokens,
            args.output_tokens,
            spread=args.length_spread,
            arrival_cv=args.arrival_cv,
        )
    try:
        requests = load_trace(args.trace)
    except FileNotFoundError:
        raise PlanInputError(f"{args.trace}: no such file") from None
    except (ValueError, OSError) as error:
        raise PlanInputError(str(error)) from None
    return from_trace(requests, args.rate, source=args.trace.name)


def list_profiles(models: bool, gpus: bool) -> str:
    lines = []
    if models:
        lines.append(f"{'MODEL':16} {'PARAMS':>8} {'ACTIVE':>8} {'KV/TOKEN':>10}  ALIASES")
        for m in MODELS.values():
            kv = m.kv_bytes_per_token() / 1024
            lines.append(
                f"{m.name:16} {m.total_params / 1e9:7.1f}B {m.active_params / 1e9:7.1f}B "
                f"{kv:8.0f}KiB  {', '.join(m.aliases)}"
            )
    if gpus:
        if lines:
            lines.append("")
        lines.append(f"{'GPU':6} {'BF16 TFLOPS':>11} {'HBM TB/s':>9} {'HBM GB':>7}")
        for g in GPUS.values():
            lines.append(
                f"{g.name:6} {g.peak_flops / 1e12:11.0f} {g.hbm_bandwidth / 1e12:9.2f} "
                f"{g.hbm_bytes / 1e9:7.0f}"
            )
    return "\n".join(lines) + "\n"


def option_json(option: Option) -> dict[str, Any]:
    prediction = option.prediction
    return {
        "mode": option.mode,
        "label": option.label,
        "prefillTensorParallelSize": option.prefill_tp or None,
        "prefillReplicas": option.prefill_replicas,
        "decodeTensorParallelSize": option.decode_tp,
        "decodeReplicas": option.decode_replicas,
        "maxNumBatchedTokens": option.max_num_batched_tokens,
        "gpus": option.gpus,
        "goodputPerGpu": None if prediction is None else round(option.goodput_per_gpu, 4),
        "simulated": prediction is not None,
        "reachesTarget": option.reaches_goal,
        "ttftP99": None if prediction is None else _finite(prediction.ttft_p99, 4),
        "tpotP99": None if prediction is None else _finite(prediction.tpot_p99, 5),
        "attainment": None if prediction is None else round(prediction.attainment, 4),
        "withinBudget": option.within_budget,
    }


def _finite(value: float, digits: int) -> float | None:
    """JSON has no infinity: a p99 of requests that never finished is null."""
    return round(value, digits) if math.isfinite(value) else None


def to_json(result: Plan, request: PlanRequest) -> dict[str, Any]:
    sizing = result.chosen.sizing
    assert sizing is not None
    return {
        "verdict": result.verdict,
        "targetAttainment": round(sizing.goal, 4),
        "peakWindows": {
            pool: {"start": w * request.window, "end": (w + 1) * request.window}
            for pool, w in sizing.peak_window.items()
        },
        "simulatedWindows": len(sizing.simulated_windows),
        "unreachableRequests": sizing.unreachable,
        "reasons": result.reasons,
        "chosen": option_json(result.chosen),
        "bounds": {pool: {"min": lo, "max": hi} for pool, (lo, hi) in result.bounds.items()},
        "options": [option_json(o) for o in result.options],
        "input": {
            "model": request.model.name,
            "gpu": request.gpu.name,
            "network": request.network.name,
            "traffic": request.traffic.source,
            "requests": len(request.traffic.trace),
            "durationSeconds": round(request.traffic.duration, 1),
            "rate": request.traffic.rate,
            "meanInputTokens": round(request.traffic.mean_prompt, 1),
            "meanOutputTokens": round(request.traffic.mean_output, 1),
            "ttft": request.slo.ttft,
            "tpot": request.slo.tpot,
            "attainment": request.slo.attainment,
            "maxGpus": request.max_gpus,
            "kvCapacityTokensTp1": kv_capacity_tokens(EngineShape(request.model, request.gpu)),
        },
    }


def to_table(result: Plan, request: PlanRequest) -> str:
    lines = [f"verdict: {result.verdict}", ""]
    lines += ["  - " + textwrap.fill(r, 96, subsequent_indent="    ") for r in result.reasons]
    lines += [
        "",
        f"  {'OPTION':46} {'GOODPUT/GPU':>11} {'GPUS':>5} {'TTFT P99':>9} {'TPOT P99':>9} "
        f"{'IN SLO':>7}",
    ]
    ranked = sorted(result.options, key=lambda o: (o.mode, o.prediction is None, o.gpus))
    for option in ranked:
        p = option.prediction
        mark = "*" if option is result.chosen else " "
        notes = [] if option.within_budget else ["over --max-gpus"]
        if p is None:
            notes.append("closed-form size, not simulated")
            goodput, latency = f"{'-':>11}", f"{'-':>9} {'-':>9} {'-':>7}"
        else:
            if not option.reaches_goal:
                notes.append("misses the target")
            goodput = f"{option.goodput_per_gpu:11.2f}"
            latency = f"{p.ttft_p99:8.3f}s {p.tpot_p99 * 1000:7.1f}ms {p.attainment:7.1%}"
        note = f"  ({'; '.join(notes)})" if notes else ""
        lines.append(f"{mark} {option.label:46} {goodput} {option.gpus:5d} {latency}{note}")
    bounds = ", ".join(f"{pool} {lo}..{hi}" for pool, (lo, hi) in result.bounds.items())
    lines += [
        "",
        f"autoscaler bounds: {bounds}",
        f"SLO: TTFT {request.slo.ttft:g}s, TPOT "
        f"{request.slo.tpot * 1000:g}ms for {request.slo.attainment:.1%} of requests "
        "(--attainment); TTFT/TPOT p99 and IN SLO are predictions from the simulated windows",
    ]
    return "\n".join(lines) + "\n"


def _yaml_comment(result: Plan) -> str:
    lines = [f"# disagg plan: {result.verdict}"]
    for reason in result.reasons:
        lines += ["# " + line for line in textwrap.wrap(reason, 96)]
    if result.verdict == "colocated":
        lines += [
            "# Colocated: one engine pool, configured by `decode`, prefills and decodes with",
            "# chunked prefill. `prefill` is not run; it is there for `mode: disaggregated`.",
        ]
    return "\n".join(lines) + "\n"
