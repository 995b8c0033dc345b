"""What an operator restart costs the SLO policy: its memory lost, or restored from status.

An operator pod restarts on every upgrade, node drain and leader change. The policy's memory
(the look-back learned from bursts, the recent recommendations it reads, the arrivals a
surge is read against, the speeds and knee learned from what the pools served) used to live
only in that pod. This runs ours, from 1P+1D, on the 64 rows of bench/policy_seeds.py with
the operator restarted at each --at time (seconds into the trace), three ways:

* no restart (the baseline every row is compared with);
* memory lost: the policy starts again from an empty memory, as before status kept it;
* memory restored: the memory goes through the status the operator writes
  (``disagg.autoscale.recall``: to the API object, to JSON and back, read at the restart)
  and the policy goes on from there.

Per restart time it prints every row that moved and the totals for both, as
policy_seeds.py does. Each restart time takes about two minutes on two idle cores:

    .venv/bin/python bench/operator_restart.py --at 600 --at 1200 --at 1800
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autoscaler_compare import usage_error
from policy_seeds import SEEDS, moved, scenarios
from rows import result_row

from disagg.autoscale.memory import PoolMemory
from disagg.autoscale.recall import recalled, remembered
from disagg.sim.fleet import PoolName, PoolStats, simulate
from disagg.sim.fleet_policies import SloPolicy
from disagg.sim.scenario import Scenario, build
from disagg.sim.traffic import Request

Memories = dict[PoolName, PoolMemory]
POOLS: tuple[PoolName, ...] = ("prefill", "decode")


def lost(memories: Memories, now: float) -> Memories:
    return {pool: PoolMemory() for pool in POOLS}


def through_status(memories: Memories, now: float) -> Memories:
    """The memories as a restarted operator reads them back from the status written at ``now``."""
    wire = json.loads(json.dumps(remembered(memories, "disaggregated", now).to_wire()))
    restored = recalled(wire, "disaggregated", POOLS, now)
    if restored.problems:
        raise RuntimeError("; ".join(restored.problems))
    return restored.memories


@dataclass
class Restarted:
    """Ours, with its memory replaced at each restart time by what ``carry`` makes of it."""

    inner: SloPolicy
    at: list[float]
    carry: Callable[[Memories, float], Memories]
    name: str = "ours, restarted"

    def desired(self, pool: PoolName, stats: PoolStats, now: float) -> int:
        while self.at and now >= self.at[0]:
            self.at.pop(0)
            kept: Memories = {p: self.inner.memory(p) for p in POOLS}
            self.inner._memory = {pool: m for pool, m in self.carry(kept, now).items()}
        return self.inner.desired(pool, stats, now)


def _run(scenario: Scenario, requests: list[Request], at: float | None, how: str) -> dict[str, Any]:
    configured = dataclasses.replace(scenario, policy="ours", prefill_replicas=1, decode_replicas=1)
    config = build(configured)
    if at is not None:
        assert isinstance(config.policy, SloPolicy)
        config.policy = Restarted(config.policy, [at], lost if how == "lost" else through_status)
    return result_row("ours", scenario, simulate(config, requests))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=float, action="append", help="restart time, s (600)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--only", action="append", help="a compare scenario or trace kind")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    times = args.at or [600.0]
    if any(not 0 < t < 86_400 for t in times) or args.workers < 1:
        return usage_error("--at must be over 0 and under a day, --workers at least 1")
    work = scenarios(args.seeds, args.only or [])
    runs: Sequence[tuple[float | None, str]] = [
        (None, "none"),
        *((t, how) for t in times for how in ("lost", "restored")),
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as executor:
        futures = {
            (at, how, name): executor.submit(_run, scenario, requests, at, how)
            for at, how in runs
            for name, scenario, requests in work
        }
        rows = {key: future.result() for key, future in futures.items()}
    names = [name for name, _, _ in work]
    baseline = {name: rows[(None, "none", name)] for name in names}
    for at in times:
        for how in ("lost", "restored"):
            print(f"\nrestart at {at:g} s, memory {how}")
            print("\n".join(moved(baseline, {n: rows[(at, how, n)] for n in names})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
