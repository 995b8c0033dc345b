"""Autoscaling policies side by side on the same seeded traffic, in simulated time.

Every policy starts from the same deployment (sized by hand for the mean rate) and sees the
same requests: the operator's SLO policy (ours, the real autoscale/policy.py), static
provisioning for the mean and for the peak rate, an HPA/KEDA-style utilization threshold, and
a throughput planner built from NVIDIA Dynamo's published formulas. New replicas serve after
the provisioning delay. Prints SLO attainment (both SLOs) and GPU-hours per policy and
scenario, then ours relative to each baseline.

    .venv/bin/python bench/autoscaler_compare.py [--json] [--provisioning-delay 120] [--only diurnal]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from disagg.sim.fleet import simulate
from disagg.sim.scenario import Scenario, build, requests_for, sized_for, summarize
from disagg.sim.traffic import WORKLOADS

BASE = Scenario(
    model="llama-3.1-70b",
    gpu="h100",
    network="ib400",
    prefill_tp=4,
    decode_tp=4,
    ttft=2.0,
    tpot=0.04,
)
SCENARIOS: dict[str, tuple[str, Scenario, float]] = {
    # name: (what it shows, scenario, peak rate / base rate)
    "steady-chat": (
        "Azure-conversation-like chat at a constant rate",
        dataclasses.replace(BASE, workload="chat", rate=8, duration=1200, shape="steady"),
        1.0,
    ),
    "bursty-code": (
        "Azure-code-like bursty arrivals plus a 5x burst in the middle fifth",
        dataclasses.replace(BASE, workload="code", rate=4, duration=1200, shape="burst"),
        5.0,
    ),
    "long-context-step": (
        "Mooncake-like long prompts; the rate triples a third of the way in",
        dataclasses.replace(
            BASE, workload="long-context", rate=0.8, duration=1200, shape="step", ttft=6.0
        ),
        3.0,
    ),
    "diurnal-chat": (
        "a day of chat compressed into half an hour, from 30% to 100% of the peak",
        dataclasses.replace(BASE, workload="chat", rate=12, duration=1800, shape="diurnal"),
        1.0,
    ),
}
POLICIES = ("ours", "static-mean", "static-peak", "threshold", "dynamo")


def run(scenario: Scenario, policy: str, peak: float) -> dict[str, Any]:
    mean_rate = scenario.rate * (0.65 if scenario.shape == "diurnal" else 1.0)
    rate = scenario.rate * peak if policy == "static-peak" else mean_rate
    prefill, decode = sized_for(scenario, rate)
    configured = dataclasses.replace(
        scenario,
        policy="static" if policy.startswith("static") else policy,
        prefill_replicas=prefill,
        decode_replicas=decode,
        max_replicas=max(16, prefill, decode),
    )
    started = time.process_time()
    result = simulate(build(configured), requests_for(configured))
    values = summarize(configured, result).values
    return {
        "policy": policy,
        "attainment": values["attainment"]["both"],
        "gpuHours": values["gpuHours"],
        "scalingActions": values["scalingActions"],
        "ttftP99": values["ttft"]["p99"],
        "tpotP99": values["tpot"]["p99"],
        "requests": values["requests"],
        "cpuSeconds": round(time.process_time() - started, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--provisioning-delay", type=float, default=120.0, help="seconds")
    parser.add_argument("--only", choices=sorted(SCENARIOS), help="run one scenario")
    args = parser.parse_args()
    report: list[dict[str, Any]] = []
    for name, (description, scenario, peak) in SCENARIOS.items():
        if args.only and name != args.only:
            continue
        scenario = dataclasses.replace(scenario, provisioning_delay=args.provisioning_delay)
        rows = [run(scenario, policy, peak) for policy in POLICIES]
        report.append({"scenario": name, "description": description, "results": rows})
        if not args.json:
            print_scenario(name, description, scenario, rows)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_relative(report)
    return 0


def print_scenario(
    name: str, description: str, scenario: Scenario, rows: list[dict[str, Any]]
) -> None:
    workload = WORKLOADS[scenario.workload]
    print(f"\n{name}: {description}")
    print(
        f"  {scenario.workload} (burstiness {workload.burstiness:g}), base {scenario.rate:g} req/s, "
        f"{scenario.duration:g}s, SLO TTFT {scenario.ttft:g}s / TPOT {scenario.tpot * 1000:g}ms, "
        f"provisioning {scenario.provisioning_delay:g}s"
    )
    print(
        f"  {'POLICY':12} {'IN SLO':>7} {'GPU-H':>7} {'ACTIONS':>8} {'TTFT P99':>9} {'TPOT P99':>9}"
    )
    for r in rows:
        ttft = "-" if r["ttftP99"] is None else f"{r['ttftP99']:.2f}s"
        tpot = "-" if r["tpotP99"] is None else f"{r['tpotP99'] * 1000:.1f}ms"
        print(
            f"  {r['policy']:12} {r['attainment']:7.1%} {r['gpuHours']:7.2f} "
            f"{r['scalingActions']:8d} {ttft:>9} {tpot:>9}"
        )


def print_relative(report: list[dict[str, Any]]) -> None:
    print("\nours relative to each baseline (attainment points, GPU-hours ratio):")
    baselines = POLICIES[1:]
    print(f"  {'SCENARIO':20} " + " ".join(f"{b:>20}" for b in baselines))
    for entry in report:
        rows = {r["policy"]: r for r in entry["results"]}
        ours = rows["ours"]
        cells = []
        for b in baselines:
            points = (ours["attainment"] - rows[b]["attainment"]) * 100
            ratio = ours["gpuHours"] / rows[b]["gpuHours"] if rows[b]["gpuHours"] else float("nan")
            cells.append(f"{points:+6.1f}pt {ratio:5.2f}x GPU-h")
        print(f"  {entry['scenario']:20} " + " ".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
