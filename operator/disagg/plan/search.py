"""How much one engine configuration serves within the SLOs, by simulation (pure).

DistServe's placement search: for a candidate engine shape, binary-search the highest request
rate at which the simulated engine still meets the SLOs for the target fraction of requests.
Every search counts a request as served only if it meets both SLOs. A disaggregated prefill
engine is searched with ample decode engines behind it (its TTFT includes the KV transfer and
the first decode step) and a decode engine with ample prefill engines in front of it (a full
decode batch makes requests wait, which shows in their TTFT), so each phase is sized on its
own and replicated to the traffic: ``n = ceil(R / prefill goodput)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final, Literal

from disagg.perf.capacity import DecodeCapacity, decode_capacity, prefill_seconds
from disagg.perf.roofline import EngineShape, NetworkProfile, kv_capacity_tokens
from disagg.plan.traffic import Traffic
from disagg.sim.fleet import FleetConfig, StepTime, simulate
from disagg.sim.results import Result, percentile

Objective = Literal["both", "ttft", "tpot"]

SEARCH_REQUESTS: Final = 300
MAX_SEARCH_REQUESTS: Final = 2000
SEARCH_STEPS: Final = 5
MIN_RATE: Final = 0.01
MAX_RATE: Final = 1e4
LIFETIMES: Final = 2
"""A sample spans this many request lifetimes, so an overload has time to build a queue."""
MIN_SAMPLE_SECONDS: Final = 30.0
DRAIN: Final = 120.0


@dataclass(frozen=True)
class Slo:
    """Latency targets and the fraction of requests that must meet both."""

    ttft: float
    tpot: float
    attainment: float = 0.9

    def met(self, result: Result, objective: Objective) -> bool:
        """Judged on the later half of the arrivals: an overload builds a queue over time,
        so the first requests of a sample would flatter it."""
        late = result.outcomes[len(result.outcomes) // 2 :]
        ttft = [o.ttft is not None and o.ttft <= self.ttft for o in late]
        tpot = [o.tpot is not None and o.tpot <= self.tpot for o in late]
        chosen = {
            "both": [a and b for a, b in zip(ttft, tpot, strict=True)],
            "ttft": ttft,
            "tpot": tpot,
        }[objective]
        return sum(chosen) >= self.attainment * max(1, len(chosen))


@dataclass(frozen=True)
class Setting:
    """What every simulated configuration shares."""

    traffic: Traffic
    slo: Slo
    network: NetworkProfile
    step_time: StepTime
    max_num_seqs: int = 256
    requests: int = SEARCH_REQUESTS
    steps: int = SEARCH_STEPS


def max_rate(
    run: Callable[[float], Result], slo: Slo, objective: Objective, steps: int, guess: float
) -> float:
    """The highest rate (req/s) meeting the SLO: bracket it from ``guess``, then bisect."""
    low = high = max(guess, MIN_RATE)
    if slo.met(run(high), objective):
        while slo.met(run(high := high * 2), objective):
            low = high
            if high > MAX_RATE:
                return low
    else:
        while not slo.met(run(low := low / 2), objective):
            high = low
            if low < MIN_RATE:
                return 0.0
    for _ in range(steps):
        middle = (low + high) / 2
        if slo.met(run(middle), objective):
            low = middle
        else:
            high = middle
    return low


def colocated_goodput(setting: Setting, shape: EngineShape, budget: int) -> float:
    """Requests/s one colocated engine (chunked prefill under ``budget``) serves in SLO."""
    config = FleetConfig(
        "colocated",
        shape,
        replicas={"prefill": 0, "decode": 1},
        budget={"prefill": budget, "decode": budget},
        max_num_seqs=setting.max_num_seqs,
        step_time=setting.step_time,
    )
    decode = _decode_capacity(setting, shape)
    isl = round(setting.traffic.mean_prompt)
    per_request = prefill_seconds(setting.step_time, shape, isl, budget) + (
        setting.traffic.mean_output * decode.step / decode.batch
    )
    return max_rate(_runner(setting, config), setting.slo, "both", setting.steps, 1 / per_request)


def prefill_goodput(setting: Setting, shape: EngineShape, decode: EngineShape) -> float:
    """Requests/s one prefill engine serves in SLO (decode never the bottleneck)."""
    config = FleetConfig(
        "disaggregated",
        decode,
        prefill_shape=shape,
        replicas={"prefill": 1, "decode": 4},
        budget={"prefill": max(8192, _longest_prompt(setting)), "decode": 2048},
        max_num_seqs=setting.max_num_seqs,
        network=setting.network,
        step_time=setting.step_time,
    )
    isl = round(setting.traffic.mean_prompt)
    guess = 1 / prefill_seconds(setting.step_time, shape, isl, config.budget["prefill"])
    return max_rate(_runner(setting, config, outputs=2), setting.slo, "both", setting.steps, guess)


def decode_goodput(setting: Setting, shape: EngineShape, prefill: EngineShape) -> float:
    """Requests/s one decode engine serves in SLO (prefill never the bottleneck)."""
    config = FleetConfig(
        "disaggregated",
        shape,
        prefill_shape=prefill,
        replicas={"prefill": 16, "decode": 1},
        budget={"prefill": max(8192, _longest_prompt(setting)), "decode": 2048},
        max_num_seqs=setting.max_num_seqs,
        network=setting.network,
        step_time=setting.step_time,
    )
    guess = _decode_capacity(setting, shape).requests_per_second
    return max_rate(_runner(setting, config), setting.slo, "both", setting.steps, guess)


@dataclass(frozen=True)
class Prediction:
    """A whole deployment simulated at the planned rate."""

    attainment: float
    ttft_p99: float
    tpot_p99: float
    goodput_per_gpu: float


def predict(setting: Setting, config: FleetConfig, requests: int) -> Prediction:
    """Simulate ``config`` at the traffic's rate; percentiles over every request."""
    sample = setting.traffic.sample(setting.traffic.rate, requests, seed=2)
    result = simulate(config, sample, drain=DRAIN)
    ttfts = [o.ttft if o.ttft is not None else math.inf for o in result.outcomes]
    tpots = [o.tpot if o.tpot is not None else math.inf for o in result.outcomes]
    return Prediction(
        attainment=result.attainment(setting.slo.ttft, setting.slo.tpot)[2],
        ttft_p99=percentile(ttfts, 0.99) or 0.0,
        tpot_p99=percentile(tpots, 0.99) or 0.0,
        goodput_per_gpu=result.goodput_per_gpu(setting.slo.ttft, setting.slo.tpot),
    )


def fits(shape: EngineShape, setting: Setting) -> bool:
    """The weights fit and the KV cache holds at least the longest request."""
    return kv_capacity_tokens(shape) >= _longest_request(setting)


def _decode_capacity(setting: Setting, shape: EngineShape) -> DecodeCapacity:
    traffic = setting.traffic
    return decode_capacity(
        setting.step_time,
        shape,
        traffic.mean_prompt,
        traffic.mean_output,
        setting.slo.tpot,
        kv_capacity_tokens(shape),
        setting.max_num_seqs,
    )


def sample_size(setting: Setting, rate: float) -> int:
    """Enough requests to span LIFETIMES request lifetimes at ``rate`` (bounded)."""
    lifetime = setting.slo.ttft + setting.traffic.mean_output * setting.slo.tpot
    wanted = math.ceil(rate * max(MIN_SAMPLE_SECONDS, LIFETIMES * lifetime))
    return max(setting.requests, min(MAX_SEARCH_REQUESTS, wanted))


def _runner(setting: Setting, config: FleetConfig, outputs: int = 0) -> Callable[[float], Result]:
    def run(rate: float) -> Result:
        sample = setting.traffic.sample(rate, sample_size(setting, rate))
        if outputs:
            sample = [replace(r, output_tokens=min(r.output_tokens, outputs)) for r in sample]
        return simulate(config, sample, drain=DRAIN)

    return run


def _longest_prompt(setting: Setting) -> int:
    sample = setting.traffic.sample(setting.traffic.rate, setting.requests)
    return max((r.prompt_tokens for r in sample), default=1)


def _longest_request(setting: Setting) -> int:
    sample = setting.traffic.sample(setting.traffic.rate, setting.requests)
    return max((r.prompt_tokens + r.output_tokens for r in sample), default=1)
