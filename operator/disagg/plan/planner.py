"""The plan: colocated or disaggregated, which engine shapes, how many replicas, and why (pure).

Every candidate shape (colocated engines at each TP degree and chunked-prefill budget;
prefill and decode engines at each TP pair NIXL accepts) gets a closed-form size for the
trace's heaviest window, the cheapest of each mode are sized by simulating the trace's peak
windows (:mod:`disagg.plan.sizing`), and one rule, :func:`split_decision`, picks the mode: a
split must save GPUs, or match them with more in-SLO requests per GPU, by a margin that pays
for a second pool and a KV-transfer path. The reasons printed are the numbers that rule used.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from disagg.api.network import nixl_tp_compatible
from disagg.perf.roofline import PrefillChunk, kv_capacity_tokens
from disagg.plan.model import (
    BUDGETS,
    DEFAULT_BUDGET,
    TP_DEGREES,
    Option,
    Plan,
    PlanRequest,
    Prediction,
    engine_shape,
)
from disagg.plan.reasons import ceilings_reason, explain, one_mode_reason, split_decision
from disagg.plan.sizing import Bar, Profile, Sizing, profile, size
from disagg.plan.traffic import PlanInputError
from disagg.plan.windows import Candidate, Context
from disagg.sim.baselines import MARGIN
from disagg.sim.fleet import Mode, PoolName

FINALISTS: Final = {"colocated": 2, "disaggregated": 2}
"""Candidates per mode sized by simulation; the rest keep their closed-form size."""

HOPELESS_MARGIN: Final = 0.0
"""A colocated shape whose mixed-step TPOT exceeds the SLO by this much is sized last."""

MAX_NUM_SEQS: Final = 256

BURST_HEADROOM: Final = 1.5
"""The autoscaler's maximum: this much above the size for the trace's peak."""


def plan(request: PlanRequest, executor: Executor | None = None) -> Plan:
    """Size the cheapest candidates of both modes on the trace and apply the split rule."""
    context = request.context()
    degrees = _feasible_degrees(request)
    _check_slo_reachable(request, degrees)
    guessed = [_closed_form(request, context, c) for c in _candidates(request, degrees)]
    ranked = _ranked(guessed, request.slo.tpot)
    sizings = _size_promising(context, ranked, executor)
    finalists = [s.candidate for s in sizings]
    goal = plan_goal(request.slo.attainment, sizings)
    sized = [_option(request, s, goal) for s in sizings]
    options = sized + [g.option for g in guessed if g.candidate not in finalists]
    hopeless = [g for g in guessed if g.hopeless(request.slo.tpot) and g.candidate not in finalists]
    serving = [o for o in sized if o.reaches_goal]
    if not serving:
        raise PlanInputError(
            f"no configuration meets TTFT {request.slo.ttft:g}s and TPOT {request.slo.tpot:g}s "
            f"for {goal:.1%} of this traffic's requests; relax the SLOs or shorten the requests"
        )
    affordable = [o for o in serving if o.within_budget]
    if not affordable:
        cheapest = min(serving, key=lambda o: o.gpus)
        raise PlanInputError(
            f"the peak of this traffic needs at least {cheapest.gpus} GPUs "
            f"({cheapest.label}); --max-gpus is {request.max_gpus}"
        )
    colocated, split = _best(affordable, "colocated"), _best(affordable, "disaggregated")
    if colocated is None or split is None:
        chosen = colocated or split
        assert chosen is not None
        rule = one_mode_reason(chosen, sized, goal, request.max_gpus)
    else:
        wins, rule = split_decision(split, colocated)
        chosen = split if wins else colocated
    reasons = explain(request, degrees, colocated, split, chosen, rule)
    if goal < request.slo.attainment:
        reasons.insert(-1, ceilings_reason(sized, goal))
    if hopeless:
        worst = min(hopeless, key=lambda g: g.mixed_tpot)
        reasons.insert(
            -1,
            f"{len(hopeless)} colocated shapes were not simulated: by the closed form, prompt "
            f"chunks in their decode steps make TPOT about {worst.mixed_tpot * 1000:.1f} ms "
            f"or more ({worst.option.label}), over the {request.slo.tpot * 1000:g} ms SLO",
        )
    return Plan(chosen.mode, reasons, chosen, options, _bounds(request, chosen), goal)


def plan_goal(target: float, sizings: list[Sizing]) -> float:
    """The one goal every shape is judged by: the target, or, when no shape can reach it,
    half a point under the best ceiling of any shape (a shape's ceiling is what it serves at
    twice its size, or, where that was not measured, the share of requests it can serve at
    all). Chasing the last half point of a ceiling buys a large fleet for a fraction of a
    point; any shape within it is a candidate, and the cheapest wins."""
    return max(s.goal for s in sizings) if sizings else target


def _feasible_degrees(request: PlanRequest) -> list[int]:
    """TP degrees within the GPU budget whose KV cache holds the longest request."""
    limit = request.max_gpus or max(TP_DEGREES)
    longest = request.traffic.longest[1]
    degrees = [
        tp
        for tp in TP_DEGREES
        if tp <= limit and kv_capacity_tokens(engine_shape(request, tp)) >= longest
    ]
    if not degrees:
        raise PlanInputError(
            f"{request.model.name} with these request lengths does not fit on "
            f"{min(limit, max(TP_DEGREES))} {request.gpu.name} GPUs (weights "
            f"{request.model.weight_bytes / 1e9:.0f} GB plus the KV cache of the longest "
            f"request, {longest} tokens); allow more GPUs or pick a larger GPU"
        )
    return degrees[:3]


def _candidates(request: PlanRequest, degrees: list[int]) -> list[Candidate]:
    shape = {tp: engine_shape(request, tp) for tp in degrees}
    colocated = [Candidate("colocated", shape[tp], None, b) for tp in degrees for b in BUDGETS]
    split = [
        Candidate("disaggregated", shape[dtp], shape[ptp], DEFAULT_BUDGET)
        for ptp in degrees
        for dtp in degrees
        if nixl_tp_compatible(ptp, dtp)  # otherwise the engines fail the KV handshake
    ]
    return colocated + split


@dataclass(frozen=True)
class Guess:
    """A candidate at its closed-form size, and the share of requests it can serve at all."""

    option: Option
    measured: Profile
    mixed_tpot: float = 0.0
    """Colocated: the mean inter-token time when prompt chunks share the decode steps."""

    @property
    def candidate(self) -> Candidate:
        return self.measured.candidate

    @property
    def reachable(self) -> float:
        return self.measured.reachable

    def hopeless(self, tpot_slo: float) -> bool:
        return self.mixed_tpot > tpot_slo * (1 + HOPELESS_MARGIN)


def _closed_form(request: PlanRequest, context: Context, candidate: Candidate) -> Guess:
    """The candidate at the size its heaviest window needs by the latency model alone."""
    measured = profile(context, candidate)
    sizes = measured.guess
    duration = max(1e-9, context.requests[-1].arrival - context.requests[0].arrival)
    served = measured.ok.count(True) / duration / candidate.gpus(sizes)
    option = _shaped(candidate, sizes, goodput_per_gpu=served)
    mixed = _mixed_tpot(request, candidate, sizes["decode"]) if candidate.mode == "colocated" else 0
    return Guess(option, measured, mixed)


def _mixed_tpot(request: PlanRequest, candidate: Candidate, replicas: int) -> float:
    """A colocated engine's mean inter-token time at the traffic's means: each second it runs
    its prompts' chunks in mixed steps and fills the rest with decode-only steps (Sarathi's
    stall). Infinite when the chunks alone take the whole second."""
    traffic, shape, step = request.traffic, candidate.decode, request.step_time
    prompt, output = max(1, round(traffic.mean_prompt)), max(1.0, traffic.mean_output)
    batch = max(1, round(traffic.rate * output * request.slo.tpot / replicas))
    contexts = [round(prompt + output / 2)] * batch
    chunk = [PrefillChunk(min(prompt, candidate.budget))]
    chunks_per_second = traffic.rate / replicas * math.ceil(prompt / candidate.budget)
    busy = chunks_per_second * step(shape, chunk, contexts)
    if busy >= 1:
        return math.inf
    return 1 / (chunks_per_second + (1 - busy) / step(shape, [], contexts))


def _shaped(candidate: Candidate, sizes: dict[PoolName, int], **fields: object) -> Option:
    return Option(
        candidate.mode,
        candidate.decode.tp,
        candidate.prefill.tp if candidate.prefill else 0,
        candidate.budget,
        prefill_replicas=sizes.get("prefill", 0),
        decode_replicas=sizes["decode"],
        **fields,  # type: ignore[arg-type]
    )


def _ranked(guessed: list[Guess], tpot_slo: float) -> dict[str, list[Guess]]:
    """Per mode, the closed-form candidates cheapest first; behind them the colocated shapes
    whose prompt chunks alone likely push TPOT past the SLO, and last those that serve fewer
    requests than the best shape."""
    best = max(g.reachable for g in guessed)
    return {
        mode: sorted(
            (g for g in guessed if g.candidate.mode == mode),
            key=lambda g: (
                max(0.0, best - MARGIN - g.reachable),
                g.hopeless(tpot_slo),
                g.option.gpus,
                g.option.decode_tp + g.option.prefill_tp,
                g.mixed_tpot,
            ),
        )
        for mode in FINALISTS
    }


def _size_promising(
    context: Context, ranked: dict[str, list[Guess]], executor: Executor | None
) -> list[Sizing]:
    """By simulation: each mode's best closed-form candidate (colocated also at the smallest
    budget, since the closed form cannot tell how a budget's chunks spread TPOT); then the
    next shape of a mode whose leader missed the goal, or whose closed-form size, scaled by
    how far the simulation moved the leader, could still need fewer GPUs. Threads drive the
    searches, which share ``executor``."""

    bar = Bar()

    def run(guesses: list[Guess]) -> list[Sizing]:
        with ThreadPoolExecutor(max_workers=max(1, len(guesses))) as threads:
            return list(threads.map(lambda g: size(context, g.measured, executor, bar), guesses))

    first = [guesses[0] for guesses in ranked.values() if guesses]
    sizings = run(first)
    reached = max(s.goal for s in sizings)
    # A shape that serves fewer requests at any size than a goal already met cannot win.
    ranked = {mode: [g for g in gs if g.reachable >= bar.goal] for mode, gs in ranked.items()}
    runners_up = []
    for mode, guesses in ranked.items():
        mine = [(g, s) for g, s in zip(first, sizings, strict=True) if g.candidate.mode == mode]
        if not mine:
            continue
        (leader, sizing), extra = mine[0], 0
        if mode == "colocated":
            runners_up += [
                g
                for g in guesses
                if g.candidate.decode == leader.candidate.decode
                and g.candidate.budget == min(BUDGETS) != leader.candidate.budget
            ]
        missed = sizing.estimate.attainment < reached
        scale = sizing.gpus / max(1, leader.option.gpus)
        tried = {(leader.option.prefill_tp, leader.option.decode_tp)}
        for guess in guesses:
            shape = (guess.option.prefill_tp, guess.option.decode_tp)
            if extra >= FINALISTS[mode] - 1 or shape in tried:
                continue
            if missed or guess.option.gpus * scale < sizing.gpus:
                runners_up.append(guess)
                tried.add(shape)
                extra += 1
    sizings = sizings + run(runners_up) if runners_up else sizings
    measured = {g.candidate: g.measured for g in [*first, *runners_up]}
    return _searched_for_one_goal(context, sizings, measured, executor, bar)


def _searched_for_one_goal(
    context: Context,
    sizings: list[Sizing],
    measured: dict[Candidate, Profile],
    executor: Executor | None,
    bar: Bar,
) -> list[Sizing]:
    """Every shape is judged by one goal: a mode whose shapes were searched for lower goals
    (their own ceilings'), none meeting the plan's, has its closest one searched again for
    it, from the size it found, if it could still serve that many requests."""
    goal = max(s.goal for s in sizings)
    behind: list[int] = []
    for mode in FINALISTS:
        of_mode = [i for i, s in enumerate(sizings) if s.candidate.mode == mode]
        if any(sizings[i].estimate.attainment >= goal for i in of_mode):
            continue
        closest = max(of_mode, key=lambda i: sizings[i].estimate.attainment, default=None)
        if closest is not None and _could_reach(sizings[closest], goal):
            behind.append(closest)
    if not behind:
        return sizings

    def again(i: int) -> Sizing:
        found = sizings[i]
        return size(context, measured[found.candidate], executor, bar, found.sizes, goal)

    searched = list(sizings)
    with ThreadPoolExecutor(max_workers=len(behind)) as threads:
        for i, sizing in zip(behind, threads.map(again, behind), strict=True):
            searched[i] = sizing
    return searched


def _could_reach(sizing: Sizing, goal: float) -> bool:
    """Whether a shape might still serve ``goal`` of the requests at some size: no measured
    ceiling below it, and enough requests it can serve at all."""
    return sizing.reachable >= goal and (sizing.ceiling is None or sizing.ceiling >= goal)


def _option(request: PlanRequest, sizing: Sizing, goal: float) -> Option:
    estimate = sizing.estimate
    prediction = Prediction(
        estimate.attainment, estimate.ttft_p99, estimate.tpot_p99, sizing.goodput_per_gpu
    )
    within = request.max_gpus is None or sizing.gpus <= request.max_gpus
    return _shaped(
        sizing.candidate,
        sizing.sizes,
        goodput_per_gpu=sizing.goodput_per_gpu,
        prediction=prediction,
        within_budget=within,
        reaches_goal=sizing.estimate.attainment >= goal,
        sizing=sizing,
    )


def _best(options: list[Option], mode: Mode) -> Option | None:
    """The fewest GPUs meeting the goal; among those, the most goodput per GPU."""
    candidates = [o for o in options if o.mode == mode and o.reaches_goal]
    return min(candidates, key=lambda o: (o.gpus, -o.goodput_per_gpu), default=None)


def _bounds(request: PlanRequest, chosen: Option) -> dict[str, tuple[int, int]]:
    """Autoscaler bounds from the traffic: the minimum carries the trace's quietest window
    (in proportion to the peak the size is for), the maximum leaves BURST_HEADROOM above."""
    bounds: dict[str, tuple[int, int]] = {"prefill": (0, 1)}
    assert chosen.sizing is not None
    loads = chosen.sizing.loads
    for pool, replicas, tp in (
        ("prefill", chosen.prefill_replicas, chosen.prefill_tp),
        ("decode", chosen.decode_replicas, chosen.decode_tp),
    ):
        if replicas == 0:
            continue
        load = [x for x in loads[pool] if x > 0] or [1.0]  # type: ignore[index]
        low = max(1, min(replicas, math.ceil(replicas * min(load) / max(load))))
        high = max(replicas + 1, math.ceil(replicas * BURST_HEADROOM))
        if request.max_gpus is not None:
            others = chosen.gpus - replicas * tp
            high = max(replicas, min(high, (request.max_gpus - others) // tp))
        bounds[pool] = (low, high)
    return bounds


def _check_slo_reachable(request: PlanRequest, degrees: list[int]) -> None:
    """Fail early when even an idle engine of the fastest shape misses an SLO."""
    shape = engine_shape(request, degrees[-1])
    prompt = max(1, round(request.traffic.mean_prompt))
    context = round(request.traffic.mean_prompt + request.traffic.mean_output / 2)
    alone_ttft = request.step_time(shape, [PrefillChunk(prompt)], [])
    alone_tpot = request.step_time(shape, [], [context])
    if alone_ttft > request.slo.ttft:
        raise PlanInputError(
            f"TTFT {request.slo.ttft:g}s is impossible: even alone on TP{shape.tp}, a "
            f"{prompt}-token prompt takes {alone_ttft:.3f}s to prefill on {request.gpu.name}; "
            "more replicas cannot make one prompt faster"
        )
    if alone_tpot > request.slo.tpot:
        raise PlanInputError(
            f"TPOT {request.slo.tpot:g}s is impossible: even alone on TP{shape.tp}, one decode "
            f"step at a {context}-token context takes {alone_tpot:.3f}s on {request.gpu.name}"
        )
