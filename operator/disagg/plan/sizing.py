"""How many replicas one deployment shape needs for a trace (pure).

The search starts from the closed-form size for the heaviest window (:class:`Profile`,
which the planner also ranks candidates by), judges sizes on the trace's peak windows
(:mod:`disagg.plan.windows`), grows until the target is met (by a quarter, or, once two
sizes have missed, to where their misses point) or to the cap (twice the largest size that
missed), which measures the ceiling, narrows back two sizes at a time and trims each pool.
When a window left out is as heavy, for the size found, as a simulated one that missed
requests, it joins the sample and the search runs again. When the target is out of reach
(long prompts no size serves) the goal is half a point under the ceiling, and the size is
polished on the whole trace, since half a point of sampling error there is half a point of
goal.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Final

from disagg.plan.windows import (
    PEAKS,
    Candidate,
    Context,
    Estimate,
    Evaluator,
    pool_loads,
    reachable,
)
from disagg.sim.baselines import MARGIN
from disagg.sim.fleet import PoolName

UTILIZATION: Final = 0.85
"""Busy share of an engine the first guess assumes; the simulation corrects it."""

MAX_REPLICAS: Final = 64

ROUNDS: Final = 3

GROWTH: Final = 1.25

MAX_LEAP: Final = 4.0
"""The most one step of the search grows a size by, however far its misses point."""


class Bar:
    """The best goal any shape of a plan has met so far, shared by the searches running
    side by side: a search whose ceiling is below it cannot win and stops."""

    def __init__(self) -> None:
        self._goal = 0.0
        self._lock = threading.Lock()

    @property
    def goal(self) -> float:
        return self._goal

    def met(self, goal: float) -> None:
        with self._lock:
            self._goal = max(self._goal, goal)


@dataclass(frozen=True)
class Sizing:
    """The cheapest size found for a candidate, and what decided it."""

    candidate: Candidate
    sizes: dict[PoolName, int]
    estimate: Estimate
    ceiling: float | None
    """Attainment with every pool at twice the first guess; None when not needed (met)."""
    goal: float
    simulated_windows: tuple[int, ...]
    peak_window: dict[PoolName, int]
    """The window with the most load per pool: the one the size is for."""
    loads: dict[PoolName, list[float]]
    """Engines each window keeps busy, per pool (closed form)."""
    unreachable: int
    requests: int
    duration: float
    evaluations: int = 0

    @property
    def gpus(self) -> int:
        return self.candidate.gpus(self.sizes)

    @property
    def reachable(self) -> float:
        """The share of the trace's requests any size of this shape could serve."""
        return 1 - self.unreachable / max(1, self.requests)

    @property
    def goodput_per_gpu(self) -> float:
        """Requests/s meeting both SLOs over the trace, per GPU."""
        good = self.estimate.attainment * self.requests
        return good / self.duration / self.gpus if self.duration and self.gpus else 0.0


@dataclass(frozen=True)
class Profile:
    """A candidate measured in closed form on the trace: which requests it can serve at all,
    and how many engines each window keeps busy per pool."""

    candidate: Candidate
    ok: list[bool]
    loads: dict[PoolName, list[float]]

    @property
    def reachable(self) -> float:
        """The share of requests any size of this shape could serve."""
        return _served_share(self.ok)

    @property
    def guess(self) -> dict[PoolName, int]:
        """The size the heaviest window needs, each engine UTILIZATION busy."""
        return {
            pool: max(1, math.ceil(max(load) / UTILIZATION)) for pool, load in self.loads.items()
        }


def profile(context: Context, candidate: Candidate) -> Profile:
    return Profile(candidate, reachable(context, candidate), pool_loads(context, candidate))


def size(
    context: Context,
    measured: Profile,
    executor: Executor | None = None,
    bar: Bar | None = None,
    start: dict[PoolName, int] | None = None,
    floor: float = 0.0,
) -> Sizing:
    """The cheapest static size meeting the target (or half a point under the ceiling) on
    the trace, searched from the closed-form guess or ``start`` (see module doc); the goal
    is at least ``floor`` while the shape can serve that many requests. A search whose
    ceiling falls short of ``bar`` (what another shape already met) stops there."""
    bar = bar or Bar()
    candidate, ok, loads = measured.candidate, measured.ok, measured.loads
    peak = {pool: max(range(len(load)), key=load.__getitem__) for pool, load in loads.items()}
    sizes = dict(start or {pool: min(MAX_REPLICAS, n) for pool, n in measured.guess.items()})
    evaluator = Evaluator(context, candidate, ok, loads, executor)
    evaluator.use(
        {w for load in loads.values() for w in _heaviest(load, PEAKS)},
        {_median(load) for load in loads.values()},
    )
    for _ in range(ROUNDS):
        sizes, estimate, ceiling, goal = _search(evaluator, sizes, bar, floor)
        suspects = _suspects(evaluator, loads, estimate)
        if not suspects:
            break
        evaluator.use(evaluator.sample | suspects)
    sample = tuple(sorted(evaluator.sample))
    whole_trace = len(evaluator.sample) == context.windows
    if goal < context.target and goal >= bar.goal and not whole_trace:
        # The target is out of reach, so the goal hangs on the ceiling: half a point of
        # sampling error there is half a point of goal. Judge the size on the whole trace.
        whole = Evaluator(context, candidate, ok, loads, executor)
        whole.use(set(range(context.windows)))
        sizes, estimate, ceiling, goal = _polish(whole, sizes, _cap(sizes), bar, floor)
        evaluator.evaluations += whole.evaluations
        sample = tuple(range(context.windows))
    if estimate.attainment >= goal:
        bar.met(goal)
    return Sizing(
        candidate,
        sizes,
        estimate,
        ceiling,
        goal,
        sample,
        peak,
        loads,
        ok.count(False),
        len(context.requests),
        context.requests[-1].arrival - context.requests[0].arrival if context.requests else 0.0,
        evaluator.evaluations,
    )


def _between(low: int, high: int, third: int) -> int:
    """The ``third``-th of three points from ``low`` to ``high``, at least one past low."""
    return low if high == low else min(high, low + max(1, (high - low) * third // 3))


def _grow(
    sizes: dict[PoolName, int], cap: dict[PoolName, int], factor: float = GROWTH
) -> dict[PoolName, int]:
    return {p: min(cap[p], max(n + 1, math.ceil(n * factor))) for p, n in sizes.items()}


def _leap(missed: list[tuple[int, float]], reach: float, goal: float) -> float:
    """How much to grow after sizes that missed the goal: by a quarter, or, once two sizes
    have missed, to where their misses point. The misses beyond the requests no size serves
    fall about geometrically with each replica added (a queue's tail), so the last two
    sizes' misses, on a log scale, extrapolate to the size where they are down to what the
    goal allows (between a quarter and four times more)."""
    if len(missed) < 2:
        return GROWTH
    (gpus_a, attained_a), (gpus_b, attained_b) = missed[-2], missed[-1]
    excess_a, excess_b, allowed = reach - attained_a, reach - attained_b, reach - goal
    if not (gpus_b > gpus_a and excess_a > excess_b > allowed > 0):
        return GROWTH
    per_gpu = math.log(excess_a / excess_b) / (gpus_b - gpus_a)
    wanted = gpus_b + math.log(excess_b / allowed) / per_gpu
    return min(MAX_LEAP, max(GROWTH, wanted / gpus_b))


def _cap(sizes: dict[PoolName, int]) -> dict[PoolName, int]:
    """The size the ceiling is measured at: twice as large, and two more."""
    return {pool: min(MAX_REPLICAS, 2 * n + 2) for pool, n in sizes.items()}


def _polish(
    whole: Evaluator,
    sizes: dict[PoolName, int],
    cap: dict[PoolName, int],
    bar: Bar,
    floor: float = 0.0,
) -> tuple[dict[PoolName, int], Estimate, float | None, float]:
    """A replica or two at a time on the whole trace: up while the goal is missed, then down
    while it is still met. The ceiling is measured (at ``cap``, the largest and slowest
    simulation) only when the size misses the goal the reachable share allows: no ceiling
    is above that share, so a size that meets it meets any goal the ceiling would set."""
    goal = _first_goal(whole, floor)
    # With one pool, one replica fewer is judged beside the size: the second core is free,
    # and a size searched on the sample is usually a replica or two over on the whole trace.
    fewer = (
        [{p: n - 1 for p, n in sizes.items()}]
        if len(sizes) == 1 and min(sizes.values()) > 1
        else []
    )
    estimate = whole.estimates([sizes, *fewer])[0]
    ceiling: float | None = None
    if estimate.attainment < goal:
        ceiling = whole.estimates([cap])[0].attainment
        goal = min(goal, ceiling - MARGIN)
        if goal < max(bar.goal, floor):  # another shape met a goal this one cannot
            return sizes, estimate, ceiling, goal
    while estimate.attainment < goal and goal >= bar.goal:
        pool = _culprit(estimate, [p for p in sizes if sizes[p] < cap[p]])
        if pool is None:
            break
        # Two sizes a round (one replica and two more), since a second core runs the second.
        trials = [{**sizes, pool: min(cap[pool], sizes[pool] + step)} for step in (1, 2)]
        trials = [t for i, t in enumerate(trials) if t not in trials[:i]]
        results = whole.estimates(trials)
        sizes, estimate = next(
            ((t, e) for t, e in zip(trials, results, strict=True) if e.attainment >= goal),
            (trials[-1], results[-1]),
        )
    while estimate.attainment >= goal:
        steps = (1, 2) if len(sizes) == 1 else (1,)  # one pool: two sizes for two cores
        trials = [{**sizes, p: sizes[p] - k} for p in sizes for k in steps if sizes[p] > k]
        passing = [
            (whole.candidate.gpus(t), -e.attainment, i, t, e)
            for i, (t, e) in enumerate(zip(trials, whole.estimates(trials), strict=True))
            if e.attainment >= goal
        ]
        if not passing:
            break
        _, _, _, sizes, estimate = min(passing)
        if len(steps) > 1 and len(passing) < len(trials):
            break  # two fewer missed: no smaller size of the one pool meets it
    return sizes, estimate, ceiling, goal


def _culprit(estimate: Estimate, raisable: list[PoolName]) -> PoolName | None:
    """The pool to raise: prefill for TTFT misses, decode for TPOT misses."""
    order = (
        ["prefill", "decode"]
        if estimate.ttft_misses >= estimate.tpot_misses
        else ["decode", "prefill"]
    )
    return next((p for p in order if p in raisable), None)


def _median(load: list[float]) -> int:
    return sorted(range(len(load)), key=load.__getitem__)[len(load) // 2]


def _heaviest(load: list[float], count: int) -> list[int]:
    return sorted(range(len(load)), key=lambda w: -load[w])[:count]


def _served_share(ok: list[bool]) -> float:
    """The share of requests a shape could serve at all (``ok``: each request's verdict)."""
    return ok.count(True) / max(1, len(ok))


def _first_goal(evaluator: Evaluator, floor: float) -> float:
    """The target, or half a point under the share of requests the shape can serve at all
    (its ceiling is measured only if that proves too high), or ``floor`` if higher."""
    return min(evaluator.context.target, max(floor, _served_share(evaluator.ok) - MARGIN))


def _search(
    evaluator: Evaluator, start: dict[PoolName, int], bar: Bar, floor: float = 0.0
) -> tuple[dict[PoolName, int], Estimate, float | None, float]:
    """Up from the first guess (by a quarter, or to where the misses point: :func:`_leap`)
    until the goal is met (or the cap, which measures the ceiling), bisect back, then each
    pool down while it is still met."""
    pools = evaluator.candidate.pools
    cap = _cap(start)
    reach = _served_share(evaluator.ok)
    goal = _first_goal(evaluator, floor)
    ceiling: float | None = None
    sizes = dict(start)
    estimate = evaluator.estimates([sizes])[0]
    if estimate.attainment < goal:
        low, high = sizes, None
        misses = [(evaluator.candidate.gpus(sizes), estimate.attainment)]
        while high is None:  # grow until the goal is met or the cap is reached; two steps
            # at a time, since the second costs no wall time on a second core. The ceiling
            # is measured at twice the largest size that missed (and two more): a first
            # guess far too small must not pass its own double off as a ceiling.
            cap = {p: max(cap[p], c) for p, c in _cap(low).items()}
            first = _grow(low, cap, _leap(misses, reach, goal))
            trials = [first] if first == cap else [first, _grow(first, cap)]
            for trial, trial_estimate in zip(trials, evaluator.estimates(trials), strict=True):
                if trial == cap:  # the ceiling: what no size of this shape improves on
                    ceiling = trial_estimate.attainment
                    goal = min(goal, ceiling - MARGIN)
                if goal < max(bar.goal, floor):  # another shape met a goal this one cannot
                    return trial, trial_estimate, ceiling, goal
                if trial_estimate.attainment >= goal:
                    high = trial
                    break
                low = trial
                misses.append((evaluator.candidate.gpus(trial), trial_estimate.attainment))
        while any(high[p] - low[p] > 1 for p in pools):  # then narrow it, two points a round
            thirds = [{p: _between(low[p], high[p], k) for p in pools} for k in (1, 2)]
            thirds = [t for i, t in enumerate(thirds) if t != high and t not in thirds[:i]]
            results = evaluator.estimates(thirds)
            met = [t for t, e in zip(thirds, results, strict=True) if e.attainment >= goal]
            if met:
                high = met[0]
            missed = [
                t
                for t, e in zip(thirds, results, strict=True)
                if e.attainment < goal and all(t[p] <= high[p] for p in pools)
            ]
            if missed:
                low = missed[-1]
            if not thirds:
                break
        sizes = high
        estimate = evaluator.estimates([sizes])[0]
        if len(pools) == 1:  # the bisection already found the smallest passing size
            return sizes, estimate, ceiling, goal
        stride = {pool: 1 for pool in pools}
    else:
        stride = {pool: max(1, sizes[pool] // 4) for pool in pools}
    while estimate.attainment >= goal:
        trials = [
            {**sizes, pool: sizes[pool] - stride[pool]}
            for pool in pools
            if sizes[pool] - stride[pool] >= 1
        ]
        if not trials:
            break
        passing = [
            (evaluator.candidate.gpus(t), -e.attainment, i, t, e)
            for i, (t, e) in enumerate(zip(trials, evaluator.estimates(trials), strict=True))
            if e.attainment >= goal
        ]
        if passing:
            _, _, _, sizes, estimate = min(passing)
            continue
        if all(s == 1 for s in stride.values()):
            break
        stride = {pool: max(1, s // 2) for pool, s in stride.items()}
    return sizes, estimate, ceiling, goal


def _suspects(
    evaluator: Evaluator,
    loads: dict[PoolName, list[float]],
    estimate: Estimate,
) -> set[int]:
    """Windows left out that are as heavy as a simulated window that missed requests."""
    missed = [
        w
        for w, (count, good) in estimate.per_window.items()
        if good < count * evaluator.context.target
    ]
    if not missed:
        return set()
    outside = [w for w in range(evaluator.context.windows) if w not in evaluator.sample]
    suspects = set()
    for load in loads.values():
        floor = min(load[w] for w in missed)
        heavy = [w for w in outside if load[w] >= floor]
        suspects.update(sorted(heavy, key=lambda w: -load[w])[:PEAKS])
    return suspects
