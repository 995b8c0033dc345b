"""Generated client requests against a real router and engine simulators: 5xx, hangs, late errors.

The generator and the judging live in e2e/router_fuzzing.py (e2e/test_router_fuzz.py runs two
seeds in `make test`); this prints the report for any seed and size, with each finding listed.

    .venv/bin/python bench/fuzz_router.py                        # 2,000 requests, seed 1
    .venv/bin/python bench/fuzz_router.py --requests 20000 --seed 7 --backend sglang
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from dataplane import engine, router
from router_fuzzing import fuzz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--show", type=int, default=10, help="findings to list per kind")
    args = parser.parse_args()
    net = "127.45.0"
    prefill = engine("fuzz-prefill", f"{net}.1", "prefill")
    decode = engine("fuzz-decode", f"{net}.2", "decode")
    front = router(
        "fuzz-router", f"{net}.3", [prefill], [decode], "--pd-threshold", "32",
        "--backend", args.backend, "--prefill-bootstrap-port", "5600",
    )  # fmt: skip
    try:
        report = asyncio.run(fuzz(front.url, args.seed, args.requests))
    finally:
        for proc in (front, prefill, decode):
            proc.stop()
    print(f"\n{report.requests} generated requests, seed {report.seed}, in {report.seconds:.0f} s")
    print("  statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(report.statuses.items())))
    findings: dict[str, list[Any]] = {
        "5xx": report.server_errors,
        "hangs": report.hangs,
        "errors after a 200": report.late_errors,
        "4xx not shaped like OpenAI's": report.unshaped_errors,
    }
    for label, found in findings.items():
        print(f"  {label:32} {len(found)}")
        for item in found[: args.show]:
            print(f"      {item}")
    return 1 if any(findings.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
