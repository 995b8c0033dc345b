"""The baselines an autoscaling policy is judged against, found by simulation (pure).

* **best static**: the cheapest fixed size per pool whose whole run meets the attainment
  target (or, where no size can, comes within half a point of the ceiling);
* **oracle**: the cheapest size per pool for every window of the trace, found in hindsight
  and ordered one provisioning delay early, then replayed; its GPU-hours are the lower bound
  every policy is reported against;
* **reactive oracle**: each minute's cheapest size (never more than its window's), acted on
  only as the minute starts, from the policies' starting size: about the best any policy
  that reacts to load (rather than foreseeing it) can do, since its replicas still take one
  provisioning delay to arrive (a little better: knowing the minute's need as it starts, it
  meets a change up to a minute before it comes);
* **ceiling**: the attainment with every pool at its maximum, i.e. what no size can improve
  (requests whose own prefill exceeds the TTFT SLO miss at any size); the **cold-start
  ceiling** is the same from the policies' starting size, every pool ordered to its maximum
  at t=0: what any policy that starts small can reach while its first replicas load.

The pools are sized one at a time with the other at its maximum, so a miss is the swept
pool's; the chosen sizes are then replayed together and raised where the replay falls short.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Final

from disagg.sim.fleet import FleetConfig, PoolName, pools_of, simulate
from disagg.sim.fleet_policies import SchedulePolicy, StaticPolicy
from disagg.sim.results import Result
from disagg.sim.traffic import Request

WINDOW: Final = 300.0
REACTIVE_WINDOW: Final = 60.0
"""The reactive bound acts on each minute's need as the minute starts."""
MARGIN: Final = 0.005
"""Half a point: where the target is out of reach, within this of the ceiling counts."""
REPAIRS: Final = 4


@dataclass(frozen=True)
class Sweep:
    """One pool's cheapest sizes: for the whole run, per window, per minute."""

    static: int
    per_window: dict[int, int]
    per_minute: dict[int, int]


@dataclass(frozen=True)
class Baseline:
    """A size (static) or a schedule (oracle) and what its replay produced."""

    name: str
    schedule: dict[PoolName, list[tuple[float, int]]]
    attainment: float
    gpu_hours: float
    scaling_actions: int
    result: Result


def window_attainment(
    result: Result, ttft_slo: float, tpot_slo: float, window: float = WINDOW
) -> dict[int, tuple[int, int]]:
    """(requests, requests meeting both SLOs) per window of arrival."""
    windows: dict[int, tuple[int, int]] = {}
    for o in result.outcomes:
        index = int(o.request.arrival // window)
        met = o.meets(ttft_slo, tpot_slo) and o.tokens >= o.request.output_tokens
        count, good = windows.get(index, (0, 0))
        windows[index] = (count + 1, good + int(met))
    return windows


def _run_static(
    config: FleetConfig, requests: Sequence[Request], sizes: dict[PoolName, int]
) -> Result:
    fixed = dataclasses.replace(
        config, replicas={**config.replicas, **sizes}, policy=StaticPolicy()
    )
    return simulate(fixed, requests)


def _run_schedule(
    config: FleetConfig,
    requests: Sequence[Request],
    schedule: dict[PoolName, list[tuple[float, int]]],
    reactive: bool = False,
) -> Result:
    """Replay a schedule: ordered one delay early (the oracle), or only when each window
    starts, from the policies' own starting size (the reactive bound)."""
    lead = 0.0 if reactive else config.provisioning_delay
    policy = SchedulePolicy(schedule, lead=lead)
    start = dict(config.replicas) if reactive else {pool: schedule[pool][0][1] for pool in schedule}
    planned = dataclasses.replace(config, replicas={**config.replicas, **start}, policy=policy)
    return simulate(planned, requests)


class Search:
    """Runs the simulations of one trace (in parallel when given an executor)."""

    def __init__(
        self,
        config: FleetConfig,
        requests: Sequence[Request],
        target: float,
        executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.requests = list(requests)
        self.target = target
        self.executor = executor
        self.pools = pools_of(config.mode)
        self.cap = {pool: config.bounds[pool][1] for pool in self.pools}
        self.floor = {pool: max(1, config.bounds[pool][0]) for pool in self.pools}
        self.gpus = {
            pool: (config.prefill_shape or config.shape).tp
            if pool == "prefill"
            else config.shape.tp
            for pool in self.pools
        }
        self._ceiling: Result | None = None

    def _map(self, jobs: Iterable[dict[PoolName, int]]) -> list[Result]:
        sizes = list(jobs)
        if self.executor is None:
            return [_run_static(self.config, self.requests, s) for s in sizes]
        futures = [self.executor.submit(_run_static, self.config, self.requests, s) for s in sizes]
        return [f.result() for f in futures]

    def _both(self, result: Result) -> float:
        return result.attainment(self.config.ttft_slo, self.config.tpot_slo)[2]

    def ceiling(self) -> Result:
        if self._ceiling is None:
            self._ceiling = self._map([dict(self.cap)])[0]
        return self._ceiling

    def _goals(self, window: float = WINDOW) -> tuple[float, dict[int, float]]:
        """The run's target and each window's: the target, or half a point under the ceiling."""
        ceiling = self.ceiling()
        run_goal = min(self.target, self._both(ceiling) - MARGIN)
        windows = window_attainment(ceiling, self.config.ttft_slo, self.config.tpot_slo, window)
        return run_goal, {
            w: min(self.target, good / count - MARGIN) for w, (count, good) in windows.items()
        }

    def sweep(self, pool: PoolName) -> Sweep:
        """The cheapest size meeting the run's goal, and per window, for one pool, with the
        other pools at their maximum."""
        run_goal, window_goals = self._goals()
        _, minute_goals = self._goals(REACTIVE_WINDOW)
        static: int | None = None
        per_window: dict[int, int] = {}
        per_minute: dict[int, int] = {}
        size = self.floor[pool]
        batch = 2 if self.executor is not None else 1
        slo = (self.config.ttft_slo, self.config.tpot_slo)
        while size <= self.cap[pool] and (static is None or len(per_window) < len(window_goals)):
            sizes = list(range(size, min(self.cap[pool], size + batch - 1) + 1))
            results = self._map({**self.cap, pool: n} for n in sizes)
            for n, result in zip(sizes, results, strict=True):
                if static is None and self._both(result) >= run_goal:
                    static = n
                for goals, found, window in (
                    (window_goals, per_window, WINDOW),
                    (minute_goals, per_minute, REACTIVE_WINDOW),
                ):
                    for w, (count, good) in window_attainment(result, *slo, window).items():
                        if w not in found and good >= goals.get(w, 0.0) * count:
                            found[w] = n
            size += batch
        for w in window_goals:
            per_window.setdefault(w, self.cap[pool])
        per_minute = {  # never more than the window that holds the minute needed
            m: min(
                per_minute.get(m, self.cap[pool]), per_window[int(m * REACTIVE_WINDOW // WINDOW)]
            )
            for m in minute_goals
        }
        return Sweep(static if static is not None else self.cap[pool], per_window, per_minute)

    def gpu_hours(self, result: Result) -> float:
        return result.gpu_seconds / 3600

    def best_static(self, sweeps: dict[PoolName, Sweep]) -> Baseline:
        """The cheapest fixed size that meets the goal when the pools run together."""
        run_goal, _ = self._goals()
        sizes = {pool: sweeps[pool].static for pool in self.pools}
        result = self._map([sizes])[0]
        for _ in range(REPAIRS):
            if self._both(result) >= run_goal:
                break
            options = [
                {**sizes, pool: sizes[pool] + 1}
                for pool in self.pools
                if sizes[pool] < self.cap[pool]
            ]
            if not options:
                break
            tried = self._map(options)
            best = max(
                range(len(options)),
                key=lambda i: (self._both(tried[i]), -self.gpu_hours(tried[i])),
            )
            sizes, result = options[best], tried[best]
        label = " + ".join(f"{sizes[p]}{p[0].upper()}" for p in self.pools)
        schedule = {pool: [(0.0, sizes[pool])] for pool in self.pools}
        return self._baseline(f"best static ({label})", schedule, result)

    def oracle(self, sweeps: dict[PoolName, Sweep]) -> Baseline:
        """Per-window cheapest sizes, ordered one provisioning delay early, replayed and
        raised in the windows where the replay falls short."""
        _, window_goals = self._goals()
        needs = {pool: dict(sweeps[pool].per_window) for pool in self.pools}
        result = None
        for _ in range(REPAIRS):
            schedule = {
                pool: [(w * WINDOW, needs[pool][w]) for w in sorted(needs[pool])]
                for pool in self.pools
            }
            result = _run_schedule(self.config, self.requests, schedule)
            windows = window_attainment(result, self.config.ttft_slo, self.config.tpot_slo)
            short = [
                w for w, (count, good) in windows.items() if good < window_goals.get(w, 0.0) * count
            ]
            if not short:
                break
            for w in short:
                pool = self._culprit(result, w)
                needs[pool][w] = min(self.cap[pool], needs[pool].get(w, 1) + 1)
        assert result is not None
        return self._baseline("oracle", schedule, result)

    def reactive(self, sweeps: dict[PoolName, Sweep]) -> Baseline:
        """Each minute's cheapest size acted on only as the minute starts, from the starting
        size: what a policy that knew the load the moment it changed would attain (the
        ceiling of any policy that reacts, since its replicas still take a delay)."""
        schedule = {
            pool: [(m * REACTIVE_WINDOW, n) for m, n in sorted(sweeps[pool].per_minute.items())]
            for pool in self.pools
        }
        result = _run_schedule(self.config, self.requests, schedule, reactive=True)
        return self._baseline("reactive oracle", schedule, result)

    def _baseline(
        self, name: str, schedule: dict[PoolName, list[tuple[float, int]]], result: Result
    ) -> Baseline:
        return Baseline(
            name,
            schedule,
            self._both(result),
            self.gpu_hours(result),
            result.scaling_actions,
            result,
        )

    def _culprit(self, result: Result, window: int) -> PoolName:
        """The pool whose SLO the window's requests missed most (TTFT: prefill)."""
        if len(self.pools) == 1:
            return self.pools[0]
        ttft_misses = tpot_misses = 0
        for o in result.outcomes:
            if int(o.request.arrival // WINDOW) != window:
                continue
            ttft_misses += int(o.ttft is None or o.ttft > self.config.ttft_slo)
            tpot_misses += int(o.tpot is None or o.tpot > self.config.tpot_slo)
        return "prefill" if ttft_misses >= tpot_misses else "decode"


def baselines(
    config: FleetConfig,
    requests: Sequence[Request],
    target: float = 0.99,
    executor: Executor | None = None,
) -> dict[str, Baseline | float]:
    """Best static, oracle, reactive oracle, and the ceilings' attainment for one trace."""
    search = Search(config, requests, target, executor)
    sweeps = {pool: search.sweep(pool) for pool in search.pools}
    oracle = search.oracle(sweeps)
    cold = _run_schedule(
        config, requests, {pool: [(0.0, search.cap[pool])] for pool in search.pools}, True
    )
    return {
        "coldCeiling": search._both(cold),
        "static": search.best_static(sweeps),
        "oracle": oracle,
        "reactive": search.reactive(sweeps),
        "ceiling": search._both(search.ceiling()),
    }
