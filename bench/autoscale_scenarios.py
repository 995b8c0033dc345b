"""How well the autoscaler does, scenario by scenario, on the real closed loop.

Runs each scenario against the local control plane (brought up if needed) with the operator,
Prometheus, the pod emulator and the router, exactly as e2e/test_autoscaling.py does, and
prints per scenario: SLO attainment at the load generator (TTFT and TPOT), GPU-minutes used,
scaling actions, failed requests and time to react. `--json` prints the same as a JSON list,
with each pool's replica count over time.

    .venv/bin/python bench/autoscale_scenarios.py [--json] [--only long-prompts]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
import itertools

from closedloop import ReplicaRecorder, Stack, drive, stack
from disagg.demo.procs import local_kube
from disagg.devcluster.layout import Layout, default_state_dir
from harness import new_namespace, wait_for

TTFT_SLO, TPOT_SLO = 1.0, 0.040


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    rate: float
    seconds: float
    prompt_tokens: int
    max_tokens: int
    settle_seconds: float


SCENARIOS = [
    Scenario(
        "long-prompts", "12k-token prompts at 3 req/s: prefill must grow", 3, 40, 12_000, 8, 5
    ),
    Scenario(
        "long-outputs", "400-token generations at 3 req/s: decode must grow", 3, 35, 100, 400, 5
    ),
    Scenario("quiet", "load stops: both pools return to their minimum", 0, 0, 0, 0, 90),
]


def _run(loop: Stack, scenario: Scenario) -> dict[str, Any]:
    assert loop.router is not None, "the scenarios drive traffic through the router"
    started = time.monotonic()
    with ReplicaRecorder(loop) as timeline:
        report = None
        if scenario.rate:
            report = asyncio.run(
                drive(
                    loop.router.url,
                    scenario.rate,
                    scenario.seconds,
                    scenario.prompt_tokens,
                    scenario.max_tokens,
                )
            )
        if scenario.name == "quiet":
            wait_for(
                "both pools at their minimum",
                lambda: loop.replicas() == {"prefill": 1, "decode": 1},
                timeout=scenario.settle_seconds,
                interval=1,
            )
        else:
            time.sleep(scenario.settle_seconds)
    samples = timeline.samples
    actions = sum(1 for (_, a), (_, b) in itertools.pairwise(samples) if a != b)
    gpu_minutes = (
        sum(
            (b[0] - a[0]) * (a[1]["prefill"] + a[1]["decode"])
            for a, b in itertools.pairwise(samples)
        )
        / 60
    )
    first = samples[0][1] if samples else {}
    react = next((t for t, s in samples if s != first), None)
    ttft_ok, tpot_ok = report.attainment(TTFT_SLO, TPOT_SLO) if report else (1.0, 1.0)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "seconds": round(time.monotonic() - started, 1),
        "ttft_attainment": round(ttft_ok, 3),
        "tpot_attainment": round(tpot_ok, 3),
        "gpu_minutes": round(gpu_minutes, 2),
        "scaling_actions": actions,
        "failed_requests": report.failed if report else 0,
        "requests": report.sent if report else 0,
        "time_to_react_seconds": round(react, 1) if react is not None else None,
        "replicas_over_time": [{"t": round(t, 1), **s} for t, s in samples],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument("--only", choices=[s.name for s in SCENARIOS], action="append")
    args = parser.parse_args()
    layout = Layout(default_state_dir())
    crds = Path(__file__).resolve().parent.parent / "crds"
    kube = local_kube(layout, lambda m: print(f"[bench] {m}", file=sys.stderr), crds)
    namespace = new_namespace(kube)
    results = []
    try:
        with stack(kube, namespace) as loop:
            for scenario in SCENARIOS:
                if args.only and scenario.name not in args.only:
                    continue
                print(f"[bench] running {scenario.name}: {scenario.description}", file=sys.stderr)
                results.append(_run(loop, scenario))
    finally:
        kube.run("delete", "namespace", namespace, "--wait=false", check=False)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    header = (
        f"{'scenario':<13} {'TTFT ok':>8} {'TPOT ok':>8} {'GPU-min':>8} {'actions':>8} "
        f"{'failed':>7} {'react s':>8} {'peak P/D':>9}"
    )
    print(
        f"SLOs: TTFT p99 {TTFT_SLO:g}s, TPOT p99 {TPOT_SLO * 1000:g}ms; attainment measured at the load generator"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        peak_p = max(s["prefill"] for s in r["replicas_over_time"])
        peak_d = max(s["decode"] for s in r["replicas_over_time"])
        react = "-" if r["time_to_react_seconds"] is None else f"{r['time_to_react_seconds']:.1f}"
        print(
            f"{r['scenario']:<13} {r['ttft_attainment']:>8.1%} {r['tpot_attainment']:>8.1%} "
            f"{r['gpu_minutes']:>8.2f} {r['scaling_actions']:>8} {r['failed_requests']:>7} {react:>8} "
            f"{peak_p:>5}/{peak_d}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
