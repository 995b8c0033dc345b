"""What forgetting a learned scale-down look-back does over hours, in the fleet simulator.

A look-back lengthened by a flap, a surge or a burst's end halves after an hour with none of
them (`LOOK_BACK_MEMORY` in `disagg.autoscale.memory`). The compare bench's traces last an hour
at most, so this runs the bursty-code deployment for three hours, two ways: bursts for the
first 30 minutes, then calm traffic that dips slowly to 40% and back (the look-back should be
forgotten), and bursts all along (each one renews it). Per trace and seed it prints ours'
attainment, GPU-hours and flaps with the look-back forgotten and kept for good, from 1P+1D
with two minutes of provisioning.

    .venv/bin/python bench/look_back_decay.py [--seeds 3] [--first-seed 101]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from traces import bursty_code

import disagg.autoscale.memory as autoscale_memory
from disagg.sim.fleet import simulate
from disagg.sim.results import flaps
from disagg.sim.scenario import build

SHAPES = {"bursts, then calm": 30.0, "bursts all along": None}


def _run(shape: str, seed: int, forget: bool) -> tuple[float, float, int]:
    """(attainment, GPU-hours, flaps) of ours on one trace; runs in a worker of its own."""
    if not forget:
        # The policy has no setting for it: a worker that keeps its look-back for good.
        autoscale_memory.LOOK_BACK_MEMORY = math.inf  # type: ignore[misc]
    scenario, requests = bursty_code(seed, hours=3.0, bursty_minutes=SHAPES[shape])
    scenario = dataclasses.replace(
        scenario, policy="ours", prefill_replicas=1, decode_replicas=1, provisioning_delay=120.0
    )
    result = simulate(build(scenario), requests)
    attainment = result.attainment(scenario.ttft, scenario.tpot)[0]
    return attainment, result.gpu_seconds / 3600, flaps(result.scaling_log)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=101)
    args = parser.parse_args()
    runs = [
        (shape, seed, forget)
        for shape in SHAPES
        for seed in range(args.first_seed, args.first_seed + args.seeds)
        for forget in (True, False)
    ]
    # One process per run: a worker that kept its look-back must not run the next trace.
    with ProcessPoolExecutor(max_workers=2, max_tasks_per_child=1) as pool:
        results = list(pool.map(_run, *zip(*runs, strict=True)))
    print(f"{'trace':20} {'seed':>4} | {'forgotten: in SLO':>17} {'GPU-h':>6} {'flaps':>5} |"
          f" {'kept: in SLO':>12} {'GPU-h':>6} {'flaps':>5}")  # fmt: skip
    for index in range(0, len(runs), 2):
        shape, seed, _ = runs[index]
        (a1, g1, f1), (a2, g2, f2) = results[index], results[index + 1]
        print(f"{shape:20} {seed:4d} | {a1:17.2%} {g1:6.2f} {f1:5d} | {a2:12.2%} {g2:6.2f} {f2:5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
