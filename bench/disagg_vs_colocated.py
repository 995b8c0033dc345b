"""Where disaggregation starts to pay: goodput per GPU of both modes by prompt length and network.

For each prompt length, the best colocated engine (chunked prefill, the better of two token
budgets) is compared with prefill and decode engines in the balanced ratio over each network,
every number found by the planner's search on the fleet simulator (the highest request rate at
which --attainment (99% by default) of requests meet both SLOs, divided by the GPUs used). Prints one table per TPOT
target and, per network, the shortest prompt from which splitting wins by more than 5%.

    .venv/bin/python bench/disagg_vs_colocated.py [--model llama-3.1-8b] [--gpu h100] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from disagg.perf import NETWORKS, EngineShape, gpu_profile, model_profile, step_time
from disagg.plan.search import Setting, colocated_goodput, decode_goodput, prefill_goodput
from disagg.plan.traffic import synthetic
from disagg.slo import Slo

PROMPTS = (128, 512, 2048, 8192, 16384)
NETWORK_ORDER = ("nvlink", "ib400", "eth100", "tcp")
BUDGETS = (512, 2048)
WIN = 1.05


def measure(
    model: str, gpu: str, output: int, ttft: float, tpot: float, attainment: float
) -> list[dict[str, Any]]:
    shape = EngineShape(model_profile(model), gpu_profile(gpu))
    rows = []
    for prompt in PROMPTS:
        traffic = synthetic(1.0, prompt, output)
        slo = Slo(ttft, tpot, attainment)
        base = Setting(traffic, slo, NETWORKS["nvlink"], step_time)
        colocated = max(colocated_goodput(base, shape, budget) for budget in BUDGETS)
        row: dict[str, Any] = {"promptTokens": prompt, "colocated": round(colocated, 3)}
        for name in NETWORK_ORDER:
            setting = Setting(traffic, slo, NETWORKS[name], step_time)
            prefill = prefill_goodput(setting, shape, shape)
            decode = decode_goodput(setting, shape, shape)
            per_gpu = 1 / (1 / prefill + 1 / decode) if prefill and decode else 0.0
            row[name] = round(per_gpu, 3)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--ttft", type=float, default=3.0, help="TTFT SLO, seconds")
    parser.add_argument(
        "--tpot", type=float, nargs="+", default=[0.02, 0.05], help="TPOT SLOs, seconds"
    )
    parser.add_argument(
        "--attainment", type=float, default=0.99, help="fraction of requests meeting both SLOs"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.process_time()
    report = []
    for tpot in args.tpot:
        rows = measure(args.model, args.gpu, args.output_tokens, args.ttft, tpot, args.attainment)
        crossover = {
            name: next((r["promptTokens"] for r in rows if r[name] > WIN * r["colocated"]), None)
            for name in NETWORK_ORDER
        }
        report.append({"tpot": tpot, "rows": rows, "crossover": crossover})
        if not args.json:
            print_table(args, tpot, rows, crossover)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"({time.process_time() - started:.0f} CPU seconds)")
    return 0


def print_table(
    args: argparse.Namespace, tpot: float, rows: list[dict[str, Any]], crossover: dict[str, Any]
) -> None:
    print(
        f"\ngoodput per GPU (req/s meeting TTFT {args.ttft:g}s and TPOT {tpot * 1000:g}ms for "
        f"{args.attainment:.0%} of requests), {args.model} on {args.gpu}, "
        f"{args.output_tokens} output tokens"
    )
    print(f"{'PROMPT':>7} {'COLOCATED':>10} " + " ".join(f"{n:>8}" for n in NETWORK_ORDER))
    for r in rows:
        cells = " ".join(
            f"{r[n]:7.2f}{'*' if r[n] > WIN * r['colocated'] else ' '}" for n in NETWORK_ORDER
        )
        print(f"{r['promptTokens']:7d} {r['colocated']:10.2f} {cells}")
    print(f"* disaggregated beats colocated by more than {WIN - 1:.0%}")
    for name, prompt in crossover.items():
        where = f"from {prompt}-token prompts" if prompt else "not within these prompt lengths"
        print(f"  crossover over {name:7}: {where}")


if __name__ == "__main__":
    sys.exit(main())
