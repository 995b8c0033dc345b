"""The plan: colocated or disaggregated, which engine shapes, how many replicas, and why (pure).

Every candidate is sized by simulation (:mod:`disagg.plan.search`): colocated engines at each
TP degree and chunked-prefill token budget, disaggregated prefill and decode engines at each
TP degree, each replicated to carry the requested rate. The verdict compares the best of
each mode on goodput per GPU; disaggregation must win by a margin to be worth operating a
second pool and a KV-transfer path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final

from disagg.api.network import nixl_tp_compatible
from disagg.perf.profiles import GpuProfile, ModelProfile
from disagg.perf.roofline import (
    EngineShape,
    NetworkProfile,
    PrefillChunk,
    StepTime,
    step_time,
    transfer_time,
)
from disagg.plan.search import (
    Prediction,
    Setting,
    Slo,
    colocated_goodput,
    decode_goodput,
    fits,
    predict,
    prefill_goodput,
)
from disagg.plan.traffic import PlanInputError, Traffic
from disagg.sim.fleet import FleetConfig, Mode

TP_DEGREES: Final = (1, 2, 4, 8)
BUDGETS: Final = (512, 2048, 8192)
DEFAULT_BUDGET: Final = 2048
SPLIT_MARGIN: Final = 0.1
"""Disaggregation must give this much more goodput per GPU than colocation to be chosen."""
PREDICT_REQUESTS: Final = 400
HEADROOM: Final = 2


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for."""

    model: ModelProfile
    gpu: GpuProfile
    network: NetworkProfile
    traffic: Traffic
    slo: Slo
    max_gpus: int | None = None
    step_time: StepTime = step_time


@dataclass(frozen=True)
class Option:
    """One deployment considered."""

    mode: Mode
    decode_tp: int
    prefill_tp: int = 0
    max_num_batched_tokens: int = 2048
    goodput_per_gpu: float = 0.0
    """Requests/s per GPU meeting the SLOs, from the per-engine searches."""
    prefill_replicas: int = 0
    decode_replicas: int = 0
    prediction: Prediction | None = None
    within_budget: bool = True

    @property
    def gpus(self) -> int:
        return self.prefill_replicas * self.prefill_tp + self.decode_replicas * self.decode_tp

    @property
    def label(self) -> str:
        if self.mode == "colocated":
            return (
                f"colocated TP{self.decode_tp} x{self.decode_replicas}, "
                f"{self.max_num_batched_tokens}-token budget"
            )
        return (
            f"prefill TP{self.prefill_tp} x{self.prefill_replicas} + "
            f"decode TP{self.decode_tp} x{self.decode_replicas}"
        )


@dataclass(frozen=True)
class Plan:
    """The answer."""

    verdict: Mode
    reasons: list[str]
    chosen: Option
    options: list[Option]
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)


def plan(request: PlanRequest) -> Plan:
    """Search both modes and pick the one with more goodput per GPU (see module doc)."""
    setting = Setting(request.traffic, request.slo, request.network, request.step_time)
    degrees = _feasible_degrees(request, setting)
    _check_slo_reachable(request, degrees)
    options = _colocated(request, setting, degrees) + _disaggregated(request, setting, degrees)
    options = [_size(request, setting, option) for option in options]
    serving = [o for o in options if o.goodput_per_gpu > 0]
    if not serving:
        raise PlanInputError(
            f"no configuration meets TTFT {request.slo.ttft:g}s and TPOT {request.slo.tpot:g}s "
            f"for {request.slo.attainment:.0%} of requests even at a trickle of traffic; "
            "relax the SLOs or shorten the requests"
        )
    affordable = [o for o in serving if o.within_budget]
    if not affordable:
        cheapest = min(serving, key=lambda o: o.gpus)
        raise PlanInputError(
            f"{request.traffic.rate:g} req/s needs at least {cheapest.gpus} GPUs "
            f"({cheapest.label}); --max-gpus is {request.max_gpus}"
        )
    best = {mode: _best(affordable, mode) for mode in ("colocated", "disaggregated")}
    colocated, split = best["colocated"], best["disaggregated"]
    wins = split is not None and (
        colocated is None or split.goodput_per_gpu > colocated.goodput_per_gpu * (1 + SPLIT_MARGIN)
    )
    chosen = split if wins and split is not None else colocated
    assert chosen is not None
    reasons = explain(request, degrees, colocated, split, chosen)
    return Plan(chosen.mode, reasons, chosen, options, _bounds(request, chosen))


def engine_shape(request: PlanRequest, tp: int) -> EngineShape:
    return EngineShape(request.model, request.gpu, tp)


def _feasible_degrees(request: PlanRequest, setting: Setting) -> list[int]:
    limit = request.max_gpus or max(TP_DEGREES)
    degrees = [tp for tp in TP_DEGREES if tp <= limit and fits(engine_shape(request, tp), setting)]
    if not degrees:
        raise PlanInputError(
            f"{request.model.name} with these request lengths does not fit on "
            f"{min(limit, max(TP_DEGREES))} {request.gpu.name} GPUs (weights "
            f"{request.model.weight_bytes / 1e9:.0f} GB plus the KV cache of the longest "
            "request); allow more GPUs or pick a larger GPU"
        )
    return degrees[:3]


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


def _colocated(request: PlanRequest, setting: Setting, degrees: list[int]) -> list[Option]:
    """Every TP degree at the default budget, then the other budgets at the best degree."""

    def option(tp: int, budget: int) -> Option:
        goodput = colocated_goodput(setting, engine_shape(request, tp), budget)
        return Option("colocated", tp, 0, budget, goodput / tp)

    options = [option(tp, DEFAULT_BUDGET) for tp in degrees]
    best = max(options, key=lambda o: o.goodput_per_gpu).decode_tp
    options += [option(best, budget) for budget in BUDGETS if budget != DEFAULT_BUDGET]
    return options


def _disaggregated(request: PlanRequest, setting: Setting, degrees: list[int]) -> list[Option]:
    smallest = engine_shape(request, degrees[0])
    prefill = {tp: prefill_goodput(setting, engine_shape(request, tp), smallest) for tp in degrees}
    decode = {tp: decode_goodput(setting, engine_shape(request, tp), smallest) for tp in degrees}
    options = []
    for ptp, prefill_rps in prefill.items():
        for dtp, decode_rps in decode.items():
            if not nixl_tp_compatible(ptp, dtp):
                continue  # the engines would fail the KV handshake
            per_gpu = (
                1 / (ptp / prefill_rps + dtp / decode_rps) if prefill_rps and decode_rps else 0.0
            )
            option = Option("disaggregated", dtp, ptp, 2048, per_gpu)
            option = replace(
                option,
                prefill_replicas=_replicas(request.traffic.rate, prefill_rps),
                decode_replicas=_replicas(request.traffic.rate, decode_rps),
            )
            options.append(option)
    return options


def _replicas(rate: float, per_engine: float) -> int:
    return math.ceil(rate / per_engine) if per_engine > 0 else 0


def _size(request: PlanRequest, setting: Setting, option: Option) -> Option:
    """Replicate to the rate (colocated: rate / per-engine goodput) and predict latencies."""
    if option.goodput_per_gpu <= 0:
        return option
    if option.mode == "colocated":
        per_engine = option.goodput_per_gpu * option.decode_tp
        option = replace(option, decode_replicas=_replicas(request.traffic.rate, per_engine))
    within = request.max_gpus is None or option.gpus <= request.max_gpus
    config = FleetConfig(
        option.mode,
        engine_shape(request, option.decode_tp),
        prefill_shape=engine_shape(request, option.prefill_tp) if option.prefill_tp else None,
        replicas={"prefill": option.prefill_replicas, "decode": option.decode_replicas},
        budget={"prefill": 8192, "decode": option.max_num_batched_tokens},
        network=request.network,
        step_time=request.step_time,
    )
    prediction = predict(setting, config, PREDICT_REQUESTS)
    return replace(option, prediction=prediction, within_budget=within)


def _best(options: list[Option], mode: Mode) -> Option | None:
    """The fewest GPUs carrying the rate; among those, the most goodput per GPU."""
    candidates = [o for o in options if o.mode == mode]
    return min(candidates, key=lambda o: (o.gpus, -o.goodput_per_gpu), default=None)


def split_wins(split: Option, colocated: Option) -> bool:
    """Splitting must save GPUs at this rate, or match them with more goodput per GPU;
    either by SPLIT_MARGIN, to pay for a second pool and a KV-transfer path."""
    if split.gpus * (1 + SPLIT_MARGIN) <= colocated.gpus:
        return True
    return split.gpus <= colocated.gpus and split.goodput_per_gpu > colocated.goodput_per_gpu * (
        1 + SPLIT_MARGIN
    )


def _bounds(request: PlanRequest, chosen: Option) -> dict[str, tuple[int, int]]:
    """Autoscaler bounds: at least one replica, at most HEADROOM times the planned count."""
    bounds = {}
    for pool, replicas, tp in (
        ("prefill", chosen.prefill_replicas, chosen.prefill_tp),
        ("decode", chosen.decode_replicas, chosen.decode_tp),
    ):
        if replicas == 0:
            bounds[pool] = (0, 1)
            continue
        high = max(replicas + 1, replicas * HEADROOM)
        if request.max_gpus is not None:
            others = chosen.gpus - replicas * tp
            high = max(replicas, min(high, (request.max_gpus - others) // tp))
        bounds[pool] = (1, high)
    return bounds


def explain(
    request: PlanRequest,
    degrees: list[int],
    colocated: Option | None,
    split: Option | None,
    chosen: Option,
) -> list[str]:
    """Plain-words reasons for the verdict, from the quantities that decide it."""
    traffic, slo = request.traffic, request.slo
    shape = engine_shape(request, degrees[0])
    prompt = max(1, round(traffic.mean_prompt))
    prefill_s = request.step_time(shape, [PrefillChunk(prompt)], [])
    reasons = []
    if colocated is not None and split is not None:
        ratio = split.goodput_per_gpu / colocated.goodput_per_gpu
        reasons.append(
            f"goodput per GPU at full load: disaggregated {split.goodput_per_gpu:.2f} req/s "
            f"vs colocated {colocated.goodput_per_gpu:.2f} ({ratio:.2f}x); splitting has to "
            f"win by {SPLIT_MARGIN:.0%} to pay for a second pool and the KV transfer"
        )
        reasons.append(
            f"at {traffic.rate:g} req/s: disaggregated needs {_gpus(split.gpus)} "
            f"({split.label}), colocated {_gpus(colocated.gpus)} ({colocated.label})"
            + (
                ": too little traffic to keep two separate pools busy"
                if split.gpus > colocated.gpus
                else ""
            )
        )
    stall = prefill_s / slo.tpot
    if stall >= 1:
        reasons.append(
            f"a mean prompt ({prompt} tokens) takes {prefill_s * 1000:.0f} ms to prefill on "
            f"TP{shape.tp}, {stall:.1f}x the TPOT SLO: in a colocated engine every prompt "
            "stalls the decodes sharing its step unless chunked small, which costs throughput"
        )
    else:
        reasons.append(
            f"a mean prompt ({prompt} tokens) takes only {prefill_s * 1000:.0f} ms to prefill, "
            f"{stall:.0%} of the TPOT SLO: prompts barely disturb decoding in a colocated engine"
        )
    transfer = transfer_time(shape, prompt, request.network)
    reasons.append(
        f"moving a mean prompt's KV cache ({prompt * shape.kv_bytes_per_token / 1e6:.0f} MB) "
        f"over {request.network.name} takes {transfer * 1000:.0f} ms, "
        f"{transfer / slo.ttft:.0%} of the TTFT SLO"
        + (" (a slow link eats into the first token)" if transfer / slo.ttft > 0.1 else "")
    )
    concurrency = traffic.rate * traffic.mean_output * slo.tpot
    reasons.append(
        f"at {traffic.rate:g} req/s with {traffic.mean_output:.0f} output tokens each, about "
        f"{concurrency:.0f} requests are decoding at any moment"
        + (
            ": low concurrency leaves little to gain from a dedicated decode pool"
            if concurrency < 16
            else ""
        )
    )
    verdict = "disaggregate" if chosen.mode == "disaggregated" else "stay colocated"
    reasons.append(f"verdict: {verdict}, {chosen.label} ({_gpus(chosen.gpus)})")
    return reasons


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
