"""How much one engine configuration serves within the SLOs, by simulation (pure).

DistServe's placement search: for a candidate engine shape, binary-search the highest request
rate at which the simulated engine still meets the SLOs for the target fraction of requests.
Every search counts a request as served only if it meets both SLOs. A disaggregated prefill
engine is searched with ample decode engines behind it (its TTFT includes the KV transfer and
the first decode step) and a decode engine with ample prefill engines in front of it (a full
decode batch makes requests wait, which shows in their TTFT), so each phase is sized on its
own and replicated to the traffic: ``n = ceil(R / prefill goodput)``.

This is goodput at full load, per engine: what bench/disagg_vs_colocated.py maps across prompt
lengths and networks. ``disagg plan`` sizes whole deployments on a trace instead
(:mod:`disagg.plan.sizing`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from disagg.perf.capacity import DecodeCapacity, decode_capacity, prefill_seconds
from disagg.perf.roofline import EngineShape, NetworkProfile, StepTime, kv_capacity_tokens
from disagg.plan.traffic import Traffic
from disagg.sim.fleet import FleetConfig, simulate
from disagg.sim.results import Result
from disagg.slo import Slo

SEARCH_REQUESTS: Final = 300
MAX_SEARCH_REQUESTS: Final = 2000
SEARCH_STEPS: Final = 5
MIN_RATE: Final = 0.01
MAX_RATE: Final = 1e4
LIFETIMES: Final = 2
"""A sample spans this many request lifetimes, so an overload has time to build a queue."""
MIN_SAMPLE_SECONDS: Final = 30.0
DRAIN: Final = 120.0


def meets(slo: Slo, result: Result) -> bool:
    """Judged on the later half of the arrivals: an overload builds a queue over time, so the
    first requests of a sample would flatter it."""
    start = len(result.outcomes) // 2
    return result.attainment(slo.ttft, slo.tpot, start)[2] >= slo.attainment


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


def max_rate(run: Callable[[float], Result], slo: Slo, steps: int, guess: float) -> float:
    """The highest rate (req/s) meeting the SLO: bracket it from ``guess``, then bisect."""
    low = high = max(guess, MIN_RATE)
    if meets(slo, run(high)):
        while meets(slo, run(high := high * 2)):
            low = high
            if high > MAX_RATE:
                return low
    else:
        while not meets(slo, run(low := low / 2)):
            high = low
            if low < MIN_RATE:
                return 0.0
    for _ in range(steps):
        middle = (low + high) / 2
        if meets(slo, run(middle)):
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
    per_request = prefill_seconds(
        setting.step_time, shape, isl, budget
    ) + decode.seconds_per_request(setting.traffic.mean_output)
    return max_rate(_runner(setting, config), setting.slo, setting.steps, 1 / per_request)


def _split(
    setting: Setting, prefill: EngineShape, decode: EngineShape, replicas: tuple[int, int]
) -> FleetConfig:
    """A disaggregated fleet of ``replicas`` (prefill, decode) engines."""
    return FleetConfig(
        "disaggregated",
        decode,
        prefill_shape=prefill,
        replicas={"prefill": replicas[0], "decode": replicas[1]},
        budget={"prefill": max(8192, setting.traffic.longest[0]), "decode": 2048},
        max_num_seqs=setting.max_num_seqs,
        network=setting.network,
        step_time=setting.step_time,
    )


def prefill_goodput(setting: Setting, shape: EngineShape, decode: EngineShape) -> float:
    """Requests/s one prefill engine serves in SLO (decode never the bottleneck)."""
    config = _split(setting, shape, decode, (1, 4))
    isl = round(setting.traffic.mean_prompt)
    guess = 1 / prefill_seconds(setting.step_time, shape, isl, config.budget["prefill"])
    return max_rate(_runner(setting, config, outputs=2), setting.slo, setting.steps, guess)


def decode_goodput(setting: Setting, shape: EngineShape, prefill: EngineShape) -> float:
    """Requests/s one decode engine serves in SLO (prefill never the bottleneck)."""
    config = _split(setting, prefill, shape, (16, 1))
    guess = _decode_capacity(setting, shape).requests_per_second
    return max_rate(_runner(setting, config), setting.slo, setting.steps, guess)


def fits(shape: EngineShape, setting: Setting) -> bool:
    """The weights fit and the KV cache holds at least the longest request."""
    return kv_capacity_tokens(shape) >= setting.traffic.longest[1]


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
