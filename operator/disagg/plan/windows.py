"""A trace cut into windows of one provisioning delay, and sizes judged on a sample of them (pure).

A static size cannot react faster than a new replica arrives, so each window is a span whose
load it must carry. Each window's load on each pool is estimated in closed form from the
latency model (the prefill engine-seconds of its prompts; the decode engine-seconds of its
outputs at the largest batch that meets TPOT). An :class:`Evaluator` simulates a sample of
windows (each behind half of the window before it, so it starts with its queue; a peak with
the heavy windows leading up to it, since a sustained peak builds its queue over several)
and judges a size by the attainment of the whole trace: sampled windows count their own
outcomes, the rest are interpolated by load between the simulated ones. A request whose
prompt alone takes longer than the TTFT SLO on the shape (or whose decode step alone exceeds
TPOT) is unreachable: no replica count serves it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Final

from disagg.perf.capacity import decode_capacity, prefill_seconds
from disagg.perf.roofline import (
    EngineShape,
    NetworkProfile,
    StepTime,
    kv_capacity_tokens,
    transfer_time,
)
from disagg.sim.fleet import FleetConfig, Mode, PoolName, pools_of, simulate
from disagg.sim.results import Outcome, latencies
from disagg.sim.traffic import Request
from disagg.slo import percentile

WINDOW: Final = 120.0
"""Seconds per window: the default provisioning delay of a new replica."""

PEAKS: Final = 3
"""Heaviest windows per pool in the first sample."""

WHOLE_TRACE: Final = 0.6
"""Simulate the whole trace once the sample covers this share of its windows."""


PREFILL_BUDGET: Final = 8192
"""Token budget of prefill engines (what the planned manifest deploys)."""


GRAIN: Final = 32
BUILD_UP: Final = 4

BUILD_UP_SHARE: Final = 0.8
"""A sampled window brings up to BUILD_UP windows before it that carry this share of its load."""

SAMPLE_SHARE: Final = 0.3
"""Build-up windows are added while the sample holds fewer than this share of the trace."""

SPAN_WINDOWS: Final = 4
"""Longest stretch of consecutive windows simulated as one run."""

WARMUP: Final = 0.5
"""Windows of traffic simulated before each sampled window, so it starts with its queue."""


@dataclass(frozen=True)
class Candidate:
    """One deployment shape: mode, TP degrees and the colocated chunk budget."""

    mode: Mode
    decode: EngineShape
    prefill: EngineShape | None = None
    budget: int = 2048

    @property
    def pools(self) -> tuple[PoolName, ...]:
        return pools_of(self.mode)

    def tp(self, pool: PoolName) -> int:
        return self.prefill.tp if pool == "prefill" and self.prefill else self.decode.tp

    def gpus(self, sizes: dict[PoolName, int]) -> int:
        return sum(sizes.get(pool, 0) * self.tp(pool) for pool in self.pools)


@dataclass(frozen=True)
class Context:
    """What every simulation of one plan shares."""

    requests: tuple[Request, ...]
    ttft: float
    tpot: float
    target: float
    network: NetworkProfile
    step_time: StepTime
    max_num_seqs: int = 256
    window: float = WINDOW

    @property
    def windows(self) -> int:
        return int(self.requests[-1].arrival // self.window) + 1 if self.requests else 0

    def index(self, request: Request) -> int:
        return int(request.arrival // self.window)


@dataclass(frozen=True)
class Estimate:
    """A size judged on the sample: the trace's attainment and where the misses were."""

    attainment: float
    ttft_misses: int
    tpot_misses: int
    per_window: dict[int, tuple[int, int]]
    """Simulated windows: (reachable requests, how many of them met both SLOs)."""
    ttft_p99: float
    tpot_p99: float


def fleet(context: Context, candidate: Candidate, sizes: dict[PoolName, int]) -> FleetConfig:
    """The static deployment of ``candidate`` at ``sizes``."""
    disaggregated = candidate.mode == "disaggregated"
    return FleetConfig(
        candidate.mode,
        candidate.decode,
        prefill_shape=candidate.prefill,
        replicas={"prefill": sizes.get("prefill", 0), "decode": sizes["decode"]},
        budget={
            "prefill": PREFILL_BUDGET if disaggregated else candidate.budget,
            "decode": candidate.budget,
        },
        max_num_seqs=context.max_num_seqs,
        network=context.network if disaggregated else None,
        step_time=context.step_time,
        ttft_slo=context.ttft,
        tpot_slo=context.tpot,
    )


def _prefill_alone(step_time: StepTime, shape: EngineShape, prompt: int, budget: int) -> float:
    """A prompt's prefill time alone, with its length rounded up to GRAIN tokens: the closed
    form visits every length of the trace for every shape, and 32 tokens is under 1% of a
    prompt long enough to matter."""
    return _prefill_rounded(step_time, shape, -(-prompt // GRAIN) * GRAIN, budget)


@functools.lru_cache(maxsize=1 << 18)
def _prefill_rounded(step_time: StepTime, shape: EngineShape, prompt: int, budget: int) -> float:
    return prefill_seconds(step_time, shape, prompt, budget)


@functools.lru_cache(maxsize=1 << 18)
def _decode_alone(step_time: StepTime, shape: EngineShape, context: int) -> float:
    return step_time(shape, [], [context])


def reachable(context: Context, candidate: Candidate) -> list[bool]:
    """Whether each request could meet both SLOs alone on an idle engine of the shape."""
    prefill = candidate.prefill or candidate.decode
    split = candidate.mode == "disaggregated"
    budget = PREFILL_BUDGET if split else candidate.budget
    step = context.step_time
    prompt_ok = {}
    for prompt in {r.prompt_tokens for r in context.requests}:
        ttft = _prefill_alone(step, prefill, prompt, budget)
        if split:
            ttft += transfer_time(prefill, prompt, context.network)
        prompt_ok[prompt] = ttft <= context.ttft
    lengths = {r.prompt_tokens + r.output_tokens for r in context.requests}
    decode_ok = {n: _decode_alone(step, candidate.decode, n) <= context.tpot for n in lengths}
    return [
        prompt_ok[r.prompt_tokens] and decode_ok[r.prompt_tokens + r.output_tokens]
        for r in context.requests
    ]


def pool_loads(context: Context, candidate: Candidate) -> dict[PoolName, list[float]]:
    """Engines each window keeps busy, per pool, from the latency model alone."""
    n, step = context.windows, context.step_time
    busy: dict[PoolName, list[float]] = {pool: [0.0] * n for pool in candidate.pools}
    grouped: list[list[Request]] = [[] for _ in range(n)]
    for r in context.requests:
        grouped[context.index(r)].append(r)
    prefill = candidate.prefill or candidate.decode
    budget = PREFILL_BUDGET if candidate.mode == "disaggregated" else candidate.budget
    kv = kv_capacity_tokens(candidate.decode)
    alone = {
        prompt: _prefill_alone(step, prefill, prompt, budget)
        for prompt in {r.prompt_tokens for r in context.requests}
    }
    for w, window in enumerate(grouped):
        if not window:
            continue
        isl = sum(r.prompt_tokens for r in window) / len(window)
        osl = sum(r.output_tokens for r in window) / len(window)
        capacity = decode_capacity(
            step, candidate.decode, isl, osl, context.tpot, kv, context.max_num_seqs
        )
        prompts = sum(alone[r.prompt_tokens] for r in window)
        decodes = sum(capacity.seconds_per_request(r.output_tokens) for r in window)
        if candidate.mode == "colocated":
            busy["decode"][w] = (prompts + decodes) / context.window
        else:
            busy["prefill"][w] = prompts / context.window
            busy["decode"][w] = decodes / context.window
    return busy


def _spans(context: Context, windows: Sequence[int]) -> list[tuple[float, float, float]]:
    """Time spans to simulate: each window behind half of the one before it, overlaps merged,
    and long spans cut into pieces of SPAN_WINDOWS (each behind its own warm-up) so the
    pieces of one run can go to different processes. The whole trace is one run, as a
    replay runs it: cut, each piece starts from half a window of warm-up instead of the
    queue the trace built, which read 95.76% for a size replaying 95.66% on a 70B
    long-context hour, enough to choose one replica too few."""
    if len(windows) == context.windows:
        return [(0.0, 0.0, math.inf)]
    merged: list[list[int]] = []
    for w in sorted(windows):
        if merged and w <= merged[-1][-1] + 1 and len(merged[-1]) < SPAN_WINDOWS:
            merged[-1].append(w)
        else:
            merged.append([w])
    size = context.window
    return [
        (max(0.0, (run[0] - WARMUP) * size), run[0] * size, (run[-1] + 1) * size) for run in merged
    ]


def _run_span(
    config: FleetConfig, requests: Sequence[tuple[int, Request]], counted_from: float
) -> list[tuple[int, Outcome]]:
    """Simulate one span's requests (shifted to start at zero); the outcomes of those
    arriving from ``counted_from`` on, keyed by trace position."""
    start = requests[0][1].arrival
    shifted = [Request(r.arrival - start, r.prompt_tokens, r.output_tokens) for _, r in requests]
    # A request still running this long after the last arrival has missed an SLO already.
    longest = max(r.output_tokens for _, r in requests)
    result = simulate(config, shifted, drain=config.ttft_slo + longest * config.tpot_slo + 1)
    return [
        (i, o)
        for (i, r), o in zip(requests, result.outcomes, strict=True)
        if r.arrival >= counted_from
    ]


class Evaluator:
    """Judges sizes of one candidate on a sample of windows (in parallel with an executor)."""

    def __init__(
        self,
        context: Context,
        candidate: Candidate,
        ok: list[bool],
        loads: dict[PoolName, list[float]],
        executor: Executor | None = None,
    ) -> None:
        self.context, self.candidate, self.ok, self.loads = context, candidate, ok, loads
        self.executor = executor
        self.sample: set[int] = set()
        self.typical: set[int] = set()
        """Windows of median load, simulated to learn how the light windows fare."""
        self.cache: dict[tuple[tuple[int, ...], tuple[tuple[str, int], ...]], Estimate] = {}
        self.evaluations = 0

    def use(self, windows: set[int], typical: set[int] | None = None) -> None:
        windows = self._with_build_up(windows)
        if typical is not None:
            self.typical = typical - windows
        if len(windows | self.typical) >= WHOLE_TRACE * self.context.windows:
            windows = set(range(self.context.windows))
        self.sample = windows
        self.typical -= windows

    def _with_build_up(self, windows: set[int]) -> set[int]:
        """Each window with the heavy windows just before it: a sustained peak builds a
        queue over several windows, and a sample that starts in its middle would miss it."""
        peak = {pool: max(load) or 1.0 for pool, load in self.loads.items()}

        def weight(w: int) -> float:
            return max(load[w] / peak[pool] for pool, load in self.loads.items())

        budget = max(2 * PEAKS, math.ceil(SAMPLE_SHARE * self.context.windows))
        grown = set(windows)
        for w in sorted(windows, key=weight, reverse=True):  # the heaviest peak first
            for before in range(w - 1, max(-1, w - 1 - BUILD_UP), -1):
                if len(grown) >= budget or weight(before) < BUILD_UP_SHARE * weight(w):
                    break
                grown.add(before)
        return grown

    def estimates(self, trials: list[dict[PoolName, int]]) -> list[Estimate]:
        key = tuple(sorted(self.sample | self.typical))
        todo = [t for t in trials if (key, _key(t)) not in self.cache]
        requests = self.context.requests
        spans = [
            ([(i, r) for i, r in enumerate(requests) if start <= r.arrival < end], counted)
            for start, counted, end in _spans(self.context, key)
        ]
        jobs = [(n, span) for n in range(len(todo)) for span in spans if span[0]]
        args = [(fleet(self.context, self.candidate, todo[n]), *span) for n, span in jobs]
        if self.executor is None:
            runs = [_run_span(*a) for a in args]
        else:
            runs = [f.result() for f in [self.executor.submit(_run_span, *a) for a in args]]
        self.evaluations += len(todo)
        for n, trial in enumerate(todo):
            outcomes = [
                pair for (job, _), run in zip(jobs, runs, strict=True) if job == n for pair in run
            ]
            self.cache[(key, _key(trial))] = self._judge(trial, outcomes)
        return [self.cache[(key, _key(t))] for t in trials]

    def _judge(self, sizes: dict[PoolName, int], outcomes: list[tuple[int, Outcome]]) -> Estimate:
        context = self.context
        requests, index = context.requests, context.index
        simulated: dict[int, tuple[int, int]] = {}
        good = ttft_misses = tpot_misses = 0
        kept = []
        for i, o in outcomes:
            w = index(requests[i])
            if w not in self.sample and w not in self.typical:
                continue  # the warm-up before a sampled window
            met = _met(o, context)
            if self.ok[i]:
                count, hits = simulated.get(w, (0, 0))
                simulated[w] = (count + 1, hits + int(met))
            if w not in self.sample:
                continue
            kept.append(o)
            good += int(met)
            if not met:
                ttft_misses += int(o.ttft is None or o.ttft > context.ttft)
                tpot_misses += int(o.tpot is None or o.tpot > context.tpot)
        reachable_outside: dict[int, int] = {}
        for r, ok in zip(requests, self.ok, strict=True):
            if ok and index(r) not in self.sample:
                reachable_outside[index(r)] = reachable_outside.get(index(r), 0) + 1
        points = sorted(
            (self._pressure(sizes, w), hits / count) for w, (count, hits) in simulated.items()
        )
        outside = sum(
            n * _interpolate(points, self._pressure(sizes, w)) for w, n in reachable_outside.items()
        )
        return Estimate(
            (good + outside) / max(1, len(requests)),
            ttft_misses,
            tpot_misses,
            {w: simulated[w] for w in self.sample if w in simulated},
            percentile(latencies(kept, "ttft"), 0.99) or 0.0,
            percentile(latencies(kept, "tpot"), 0.99) or 0.0,
        )

    def _pressure(self, sizes: dict[PoolName, int], window: int) -> float:
        """How busy the window keeps the busiest pool at ``sizes``, by the closed form."""
        return max(load[window] / max(1, sizes[pool]) for pool, load in self.loads.items())


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Attainment at pressure ``x``, linear between the simulated windows around it."""
    if not points:
        return 1.0
    if x <= points[0][0]:
        return max(p[1] for p in points if p[0] <= points[0][0])
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def _met(outcome: Outcome, context: Context) -> bool:
    done = outcome.tokens >= outcome.request.output_tokens
    return done and outcome.meets(context.ttft, context.tpot)


def _key(sizes: dict[PoolName, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(sizes.items()))
