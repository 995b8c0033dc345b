"""The verdict's rule and the plan's reasons in plain words (pure).

:func:`split_decision` is the one rule the verdict follows; the sentence it returns is the
reason printed for it. The other reasons are the quantities behind the sizes: the window that
set each pool, the requests no size serves, how long a prompt stalls a colocated decode step,
what the KV transfer costs, how many requests decode at once.
"""

from __future__ import annotations

from disagg.perf.roofline import PrefillChunk, transfer_time
from disagg.plan.model import SPLIT_MARGIN, TP_DEGREES, Option, PlanRequest, engine_shape
from disagg.plan.sizing import Sizing
from disagg.plan.windows import Candidate, reachable


def split_decision(split: Option, colocated: Option) -> tuple[bool, str]:
    """The one rule: split when it saves SPLIT_MARGIN of the GPUs, or needs no more GPUs and
    serves SPLIT_MARGIN more in-SLO requests per GPU (a second pool and a KV-transfer path
    are not free). Returns the decision and the sentence that states it."""
    saved = colocated.gpus - split.gpus
    share = saved / colocated.gpus
    if share >= SPLIT_MARGIN:
        return True, (
            f"splitting saves {_gpus(saved)} ({share:.0%}), at least the {SPLIT_MARGIN:.0%} "
            "a second pool and the KV transfer must earn"
        )
    gain = split.goodput_per_gpu / colocated.goodput_per_gpu - 1 if colocated.goodput_per_gpu else 0
    if saved >= 0 and gain >= SPLIT_MARGIN:
        return True, (
            f"splitting needs no more GPUs and serves {gain:.0%} more in-SLO requests per GPU, "
            f"at least the {SPLIT_MARGIN:.0%} a second pool and the KV transfer must earn"
        )
    if saved < 0:
        return False, (
            f"splitting needs {_gpus(-saved)} more: too little traffic to keep two separate "
            "pools busy"
        )
    saving = "needs the same GPUs" if saved == 0 else f"saves only {_gpus(saved)} ({share:.0%})"
    return False, (
        f"splitting {saving} and serves {gain:+.0%} in-SLO requests per GPU, less than the "
        f"{SPLIT_MARGIN:.0%} a second pool and the KV transfer must earn"
    )


def one_mode_reason(chosen: Option, sized: list[Option], goal: float, max_gpus: int | None) -> str:
    other = [o for o in sized if o.mode != chosen.mode and o.prediction is not None]
    best = max(other, key=lambda o: o.prediction.attainment if o.prediction else 0, default=None)
    if best is None or best.prediction is None:
        return f"{chosen.mode} is the only mode with a shape that fits"
    if best.reaches_goal:  # it reached the goal but not within the GPU budget
        return f"{best.mode} needs {_gpus(best.gpus)}, more than --max-gpus {max_gpus}"
    return (
        f"{best.mode} reaches only {best.prediction.attainment:.1%} of requests at best "
        f"({best.label}), short of the {goal:.1%} target"
    )


def ceilings_reason(sized: list[Option], goal: float) -> str:
    """When the target is out of reach: what each simulated shape serves at its size, the most
    it serves at any size, and what it costs, so the user sees what the goal weighed."""
    parts = []
    for option in sorted(sized, key=lambda o: o.gpus):
        sizing, prediction = option.sizing, option.prediction
        assert sizing is not None and prediction is not None
        ceiling = (
            f"ceiling {sizing.ceiling:.1%}"
            if sizing.ceiling is not None
            else f"ceiling at most {sizing.reachable:.1%}"
        )
        mark = "" if option.reaches_goal else ", short"
        parts.append(
            f"{option.label}: {_gpus(option.gpus)}, {prediction.attainment:.1%} ({ceiling}{mark})"
        )
    return (
        f"no shape reaches the target, so every shape is judged by {goal:.1%}, half a point "
        f"under the best ceiling, and the cheapest that meets it wins: " + "; ".join(parts)
    )


def explain(
    request: PlanRequest,
    degrees: list[int],
    colocated: Option | None,
    split: Option | None,
    chosen: Option,
    rule: str,
) -> list[str]:
    """Plain-words reasons for the verdict, from the quantities that decide it."""
    traffic, slo = request.traffic, request.slo
    shape = engine_shape(request, degrees[0])
    prompt = max(1, round(traffic.mean_prompt))
    prefill_s = request.step_time(shape, [PrefillChunk(prompt)], [])
    reasons = [f"traffic: {traffic.describe()}"]
    assert chosen.sizing is not None
    reasons.append(_peak_reason(request, chosen.sizing))
    unreachable = _unreachable_reason(request, chosen, degrees)
    if unreachable:
        reasons.append(unreachable)
    target = f"{chosen.sizing.goal:.1%} of requests"
    if colocated is not None and split is not None:
        reasons.append(
            f"for {target} within both SLOs: disaggregated needs {_gpus(split.gpus)} "
            f"({split.label}), colocated {_gpus(colocated.gpus)} ({colocated.label}); "
            f"in-SLO requests/s per GPU {split.goodput_per_gpu:.2f} vs "
            f"{colocated.goodput_per_gpu:.2f}"
        )
    reasons.append(rule)
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
        f"at {traffic.rate:.3g} req/s with {traffic.mean_output:.0f} output tokens each, about "
        f"{concurrency:.0f} requests are decoding at any moment"
        + (
            ": low concurrency leaves little to gain from a dedicated decode pool"
            if concurrency < 16
            else ""
        )
    )
    verdict = "disaggregate" if chosen.mode == "disaggregated" else "stay colocated"
    reasons.append(f"verdict: {verdict}, {chosen.label} ({_gpus(chosen.gpus)}), because {rule}")
    return reasons


def _peak_reason(request: PlanRequest, sizing: Sizing) -> str:
    """Which window set each pool's size, and what was in it."""
    window = request.window
    by_window: dict[int, list[str]] = {}
    for pool, w in sizing.peak_window.items():
        name = "engine" if sizing.candidate.mode == "colocated" else pool
        by_window.setdefault(w, []).append(name)
    parts = []
    for w, names in by_window.items():
        inside = [r for r in request.traffic.trace if int(r.arrival // window) == w]
        pools = " and ".join(names) + (" pools" if len(names) > 1 else " pool")
        parts.append(
            f"the {pools} by the window at {w * window:.0f}-{(w + 1) * window:.0f}s "
            f"({len(inside) / window:.3g} req/s, "
            f"{sum(r.prompt_tokens for r in inside) / window:.0f} prompt tokens/s, "
            f"{sum(r.output_tokens for r in inside) / window:.0f} output tokens/s)"
        )
    return (
        f"sized for the peak over one provisioning delay ({window:g}s windows): "
        + "; ".join(parts)
        + f"; {len(sizing.simulated_windows)} of {max(1, len(sizing.loads['decode']))} windows "
        "simulated (the peaks, their build-up and a median one), the rest interpolated by load"
    )


def _unreachable_reason(request: PlanRequest, chosen: Option, degrees: list[int]) -> str:
    """The requests no size serves on the chosen shape, and the TP degree that would."""
    sizing = chosen.sizing
    assert sizing is not None
    if not sizing.unreachable:
        return ""
    candidate = sizing.candidate
    share = sizing.unreachable / max(1, sizing.requests)
    context = request.context()
    served_by = ""
    prefill_tp = candidate.prefill.tp if candidate.prefill else candidate.decode.tp
    for tp in TP_DEGREES:
        if tp <= prefill_tp:
            continue
        wider = Candidate(
            candidate.mode,
            engine_shape(request, tp) if candidate.mode == "colocated" else candidate.decode,
            engine_shape(request, tp) if candidate.prefill else None,
            candidate.budget,
        )
        still = reachable(context, wider).count(False)
        beyond = (
            " (more GPUs than --max-gpus)" if request.max_gpus and tp > request.max_gpus else ""
        )
        served_by = (
            f"; TP{tp}{beyond} would serve {sizing.unreachable - still} of them"
            if still < sizing.unreachable
            else ""
        )
        if served_by:
            break
    return (
        f"{sizing.unreachable} requests ({share:.1%}) cannot meet the SLOs at any size on "
        f"TP{prefill_tp}: alone on an idle engine their prompt takes longer than TTFT "
        f"{request.slo.ttft:g}s to prefill (or a decode step longer than TPOT)"
        + (
            f", so the target becomes {sizing.goal:.1%}, half a point under the ceiling"
            if sizing.goal < request.slo.attainment
            else ""
        )
        + (served_by or f"; no TP degree up to {max(TP_DEGREES)} serves them")
    )


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
