"""What a change to the SLO policy moves: ours alone, from 1P+1D, on many seeds and delays.

bench/autoscaler_compare.py judges every policy against its baselines on three seeds. This
runs only ours, on the compare scenarios and the four trace kinds over fifteen seeds
(101-103, 201-203, ..., 501-503: 64 rows), at one or more provisioning delays. That judges
a change on seeds and delays it was not written against. Save a run of the code before
the change, then compare:

    git worktree add /tmp/base HEAD
    PYTHONPATH=/tmp/base/operator .venv/bin/python bench/policy_seeds.py \\
        --delay 60 --delay 120 --delay 300 --out /tmp/base.json
    .venv/bin/python bench/policy_seeds.py --delay 60 --delay 120 --delay 300 \\
        --against /tmp/base.json

Per delay, it prints every row that moved (attainment, GPU-hours, flaps), the totals, and
the GPU-hours of each pool (when both runs have the split).
Without --against it prints each trace kind's mean attainment, its GPU-hours and its flaps.
The traces come from this tree's bench/traces.py, so both runs see the same requests. Each
delay takes about a minute on two idle cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autoscaler_compare import COMPARE, TRACE_KINDS, run_policy, usage_error
from autoscaler_compare import scenarios as compare_scenarios

from disagg.sim.scenario import Scenario
from disagg.sim.traffic import Request

SEEDS = tuple(hundred + n for hundred in (100, 200, 300, 400, 500) for n in (1, 2, 3))
Row = dict[str, Any]
Run = dict[str, dict[str, Row]]
"""Rows by name, per provisioning delay (its seconds, as text: JSON keys)."""


def scenarios(
    seeds: Sequence[int], only: Sequence[str]
) -> list[tuple[str, Scenario, list[Request]]]:
    """The compare bench's scenarios at these seeds, those named in ``only`` (all without)."""
    work = compare_scenarios(seeds)
    return [(name, s, r) for name, _, s, r in work if not only or name.split("/")[0] in only]


def _ours(scenario: Scenario, requests: list[Request], delay: float) -> Row:
    return run_policy(dataclasses.replace(scenario, provisioning_delay=delay), requests, "ours")


def run(
    work: Sequence[tuple[str, Scenario, list[Request]]], delays: Sequence[float], workers: int
) -> Run:
    with ProcessPoolExecutor(max_workers=workers) as executor:
        futures = {
            (_key(delay), name): executor.submit(_ours, scenario, requests, delay)
            for delay in delays
            for name, scenario, requests in work
        }
        result: Run = {_key(delay): {} for delay in delays}
        for (delay_key, name), future in futures.items():
            result[delay_key][name] = future.result()
    return result


def _key(delay: float) -> str:
    return f"{delay:g}"


def moved(before: dict[str, Row], after: dict[str, Row]) -> list[str]:
    """One line per row whose attainment, GPU-hours or flaps changed, then the totals."""
    lines, changed = [], 0
    for name, new in after.items():
        old = before.get(name)
        if old is None:
            lines.append(f"  {name:26} not in the saved run")
            continue
        same = (
            abs(old["attainment"] - new["attainment"]) < 1e-9
            and abs(old["gpuHours"] - new["gpuHours"]) < 1e-9
            and old["flaps"] == new["flaps"]
        )
        if same:
            continue
        changed += 1
        lines.append(
            f"  {name:26} {old['attainment']:6.1%} -> {new['attainment']:6.1%}  "
            f"GPU-h {old['gpuHours']:7.2f} -> {new['gpuHours']:7.2f} "
            f"({new['gpuHours'] / old['gpuHours'] - 1:+.1%})  flaps {old['flaps']} -> {new['flaps']}"
        )
    common = [name for name in after if name in before]
    if not common:
        return [*lines, "  no row in common with the saved run"]
    hours = [sum(rows[n]["gpuHours"] for n in common) for rows in (before, after)]
    flaps = [sum(rows[n]["flaps"] for n in common) for rows in (before, after)]
    mean = [sum(rows[n]["attainment"] for n in common) / len(common) for rows in (before, after)]
    lines.append(
        f"  {changed} of {len(common)} rows moved; mean attainment {mean[0]:.2%} -> "
        f"{mean[1]:.2%}; GPU-hours {hours[0]:.2f} -> {hours[1]:.2f} "
        f"({hours[1] / hours[0] - 1:+.2%}); flaps {flaps[0]} -> {flaps[1]}"
    )
    split = [pool_hours([rows[n] for n in common]) for rows in (before, after)]
    if split[0] and split[0].keys() == split[1].keys():
        lines.append(
            "  by pool: "
            + ", ".join(f"{pool} {split[0][pool]:.2f} -> {split[1][pool]:.2f}" for pool in split[1])
        )
    return lines


def pool_hours(rows: Sequence[Row]) -> dict[str, float]:
    """GPU-hours summed per pool; empty when a row has no split (a run saved before the
    simulator kept one)."""
    total: dict[str, float] = {}
    for row in rows:
        by_pool = row.get("gpuHoursByPool")
        if not isinstance(by_pool, dict):
            return {}
        for pool, hours in by_pool.items():
            if not _is_number(hours):
                return {}
            total[pool] = total.get(pool, 0.0) + hours
    return total


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary(rows: dict[str, Row]) -> list[str]:
    """Each trace kind's (and each compare scenario's) mean attainment, GPU-hours, flaps."""
    kinds: dict[str, list[Row]] = {}
    for name, row in rows.items():
        kinds.setdefault(name.split("/")[0] + ("/*" if "/" in name else ""), []).append(row)
    lines = [f"  {'ROWS':24} {'N':>3} {'IN SLO':>7} {'GPU-H':>8} {'FLAPS':>6}"]
    for kind, group in kinds.items():
        attainment = sum(r["attainment"] for r in group) / len(group)
        hours = sum(r["gpuHours"] for r in group)
        lines.append(
            f"  {kind:24} {len(group):3d} {attainment:7.1%} {hours:8.2f} "
            f"{sum(r['flaps'] for r in group):6d}"
        )
    return lines


def load_saved(path: Path, delays: Sequence[float]) -> Run | str:
    """The saved run, or what is wrong with it."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return f"--against {path}: {error}"
    runs = saved.get("delays") if isinstance(saved, dict) else None
    if not isinstance(runs, dict):
        return f"--against {path}: not a run saved by --out (no 'delays' object)"
    missing = [_key(d) for d in delays if _key(d) not in runs]
    if missing:
        return (
            f"--against {path}: no run at {', '.join(missing)} s "
            f"(it has {', '.join(runs) or 'none'})"
        )
    for key in map(_key, delays):
        rows = runs[key]
        if not isinstance(rows, dict):
            return f"--against {path}: the run at {key} s is not an object of rows"
        for name, row in rows.items():
            fields = ("attainment", "gpuHours", "flaps")
            if not isinstance(row, dict) or not all(_is_number(row.get(f)) for f in fields):
                return f"--against {path}: row {name!r} at {key} s needs numbers for {fields}"
    return {key: runs[key] for key in map(_key, delays)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--delay", type=float, action="append", help="provisioning delay, s (repeatable; 120)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--only", action="append", help="a compare scenario or trace kind")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, help="save the run here")
    parser.add_argument("--against", type=Path, help="a run saved by --out to compare with")
    args = parser.parse_args()
    delays = args.delay or [120.0]
    if any(not 0 < d < 86_400 for d in delays):
        return usage_error("--delay must be over 0 and under a day")
    if args.workers < 1 or not args.seeds:
        return usage_error("--workers and --seeds need at least one")
    known = list(dict.fromkeys([*COMPARE, *TRACE_KINDS]))
    unknown = [o for o in args.only or [] if o not in known]
    if unknown:
        return usage_error(
            f"--only {', '.join(unknown)}: not a scenario; known: {', '.join(known)}"
        )
    saved = load_saved(args.against, delays) if args.against else None
    if isinstance(saved, str):
        return usage_error(saved)
    result = run(scenarios(args.seeds, args.only or []), delays, args.workers)
    if args.out:
        args.out.write_text(json.dumps({"seeds": args.seeds, "delays": result}, indent=1))
    for key, rows in result.items():
        print(f"\nprovisioning delay {key} s")
        print("\n".join(summary(rows) if saved is None else moved(saved[key], rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
