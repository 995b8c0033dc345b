"""Mutated DisaggregatedModels through `disagg validate` and the real API server, side by side.

The generator and the judging live in e2e/fuzzing.py (e2e/test_fuzz.py runs two seeds in
`make test`); this prints the report for any seed and size, with each disagreement, refused
child and crash listed.

    .venv/bin/python bench/fuzz_models.py                      # 2,000 models, seed 1
    .venv/bin/python bench/fuzz_models.py --models 10000 --seed 7
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from disagg.demo.procs import local_kube
from disagg.devcluster.layout import Layout, default_state_dir
from fuzzing import run

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=15, help="disagreements to list")
    args = parser.parse_args()
    kube = local_kube(
        Layout(default_state_dir()), lambda m: print(f"[fuzz] {m}", file=sys.stderr), ROOT / "crds"
    )
    namespace = f"fuzz-{uuid.uuid4().hex[:6]}"
    kube.run("create", "namespace", namespace)
    try:
        report = run(kube, namespace, args.seed, args.models)
    finally:
        kube.run("delete", "namespace", namespace, "--wait=false", check=False)
    print(f"\n{report.models} mutated models, seed {report.seed}, in {report.seconds:.0f} s")
    rows = [
        ("accepted by both", report.accepted),
        ("refused by both", report.refused),
        ("disagreements", len(report.disagreements)),
        (f"children refused (of {report.children})", len(report.refused_children)),
        ("crashes", len(report.crashes)),
    ]
    for label, value in rows:
        print(f"  {label:42} {value:6d}")
    took, name = report.slowest_parse
    print(f"  {'slowest parse':42} {took * 1000:6.1f} ms ({name})")
    for name, changes, mine, theirs in report.disagreements[: args.show]:
        side = "we accept, the API server refuses" if mine is None else "we refuse, it accepts"
        print(f"\n  {name}: {side}\n    {changes}\n    ours: {mine}\n    server: {theirs}")
    for name, line in list(report.refused_children.items())[: args.show]:
        print(f"\n  child {name}: {line}")
    for crash in report.crashes[: args.show]:
        print(f"\n  crash: {crash}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
