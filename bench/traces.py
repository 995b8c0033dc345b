"""Four kinds of request traces the autoscaler is judged on, generated from a seed.

They are shaped like what users bring, not like the compare scenarios: each has its own
deployment (model, TP, SLOs) and a shape that moves mid-trace.

* ``chat-wave``: chat on an 8B model, with a 10-minute wave in which 40% of the prompts are
  8-16k tokens long;
* ``bursty-code``: code completion with bursty (Gamma CV 4) arrivals and three surprise
  bursts of 2-4x the rate, 1-3 minutes each, at seeded times;
* ``diurnal-long``: Mooncake-like long prompts on a 70B model at TP8, a day compressed into
  an hour; the longest prompts cannot meet the TTFT SLO on one TP8 prefill;
* ``output-shift``: chat on a 70B model at TP4 whose output lengths quadruple halfway
  through.

``python bench/traces.py KIND SEED OUT.csv`` writes one (columns arrival_s, input_tokens,
output_tokens), which ``disagg simulate --trace`` and ``autoscaler_compare.py --trace`` read.
"""

from __future__ import annotations

import csv
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

from disagg.sim.scenario import Scenario
from disagg.sim.traffic import Request

KINDS = ("chat-wave", "bursty-code", "diurnal-long", "output-shift")


def _lognormal(rng: random.Random, mu: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(mu, sigma))))


def _arrivals(
    rng: random.Random, rate: Callable[[float], float], peak: float, duration: float, cv: float
) -> list[float]:
    """Gamma inter-arrivals with coefficient of variation ``cv`` at ``peak``, thinned to
    follow ``rate(t)``."""
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.gammavariate(1 / cv**2, cv**2 / peak) if cv != 1 else rng.expovariate(peak)
        if t >= duration:
            return times
        if rng.random() <= rate(t) / peak:
            times.append(t)


def chat_wave(seed: int) -> tuple[Scenario, list[Request]]:
    rng = random.Random(seed)
    duration, wave = 2400.0, (900.0 + rng.uniform(-120, 120), 600.0)
    requests = []
    for t in _arrivals(rng, lambda _: 6.0, 6.0, duration, 1.0):
        in_wave = wave[0] <= t < wave[0] + wave[1]
        if in_wave and rng.random() < 0.4:
            prompt = rng.randint(8000, 16000)
        else:
            prompt = _lognormal(rng, 6.6, 0.9, 16, 8000)
        requests.append(Request(t, prompt, _lognormal(rng, 5.0, 0.8, 1, 1000)))
    scenario = Scenario(model="llama-3.1-8b", ttft=2.0, tpot=0.04, duration=duration)
    return scenario, requests


def bursty_code(
    seed: int, hours: float = 0.5, bursty_minutes: float | None = None
) -> tuple[Scenario, list[Request]]:
    """Code completion with a 2-4x surprise burst in every 10 minutes of ``hours`` (30 minutes
    for the compare bench); with ``bursty_minutes``, bursts only in those, then calm traffic
    that dips slowly to 40% from the second hour and comes back (longer than a learned
    look-back is kept: bench/look_back_decay.py)."""
    rng = random.Random(seed)
    duration = hours * 3600
    bursty = duration if bursty_minutes is None else bursty_minutes * 60
    bursts = []
    for period in range(int(bursty // 600)):
        start = period * 600 + rng.uniform(100, 400)
        bursts.append((start, start + rng.uniform(60, 180), rng.uniform(2, 4)))

    def rate(t: float) -> float:
        dip = 0.6 * max(0.0, math.sin(math.pi * (t - 3600) / 7200)) if t > 3600 else 0.0
        base = 5.0 if bursty_minutes is None else 5.0 * (1 - dip)
        return base * max([f for s, e, f in bursts if s <= t < e] or [1.0])

    requests = [
        Request(t, _lognormal(rng, 7.0, 1.3, 16, 7437), _lognormal(rng, 2.8, 0.85, 1, 512))
        for t in _arrivals(rng, rate, 20.0, duration, 4.0)
    ]
    return Scenario(model="llama-3.1-8b", ttft=1.0, tpot=0.03, duration=duration), requests


def diurnal_long(seed: int, peak: float = 1.2) -> tuple[Scenario, list[Request]]:
    """``peak`` requests/s at midday; 1.2 keeps a fleet of a few TP8 engines, 6 one of tens."""
    rng = random.Random(seed)
    duration = 3600.0

    def rate(t: float) -> float:
        return peak * (0.25 + 0.75 * (0.5 - 0.5 * math.cos(2 * math.pi * t / duration)))

    requests = [
        Request(t, _lognormal(rng, 8.9, 1.0, 256, 120_000), _lognormal(rng, 5.3, 1.0, 1, 1000))
        for t in _arrivals(rng, rate, peak, duration, 1.0)
    ]
    scenario = Scenario(
        model="llama-3.1-70b",
        prefill_tp=8,
        decode_tp=8,
        ttft=3.0,
        tpot=0.05,
        duration=duration,
        max_num_batched_tokens=8192,
    )
    return scenario, requests


def output_shift(seed: int) -> tuple[Scenario, list[Request]]:
    rng = random.Random(seed)
    duration = 2400.0
    shift = duration / 2 + rng.uniform(-200, 200)
    requests = []
    for t in _arrivals(rng, lambda _: 10.0, 10.0, duration, 1.0):
        mu = 5.0 if t < shift else 5.0 + math.log(4)
        requests.append(
            Request(t, _lognormal(rng, 6.6, 0.9, 16, 8000), _lognormal(rng, mu, 0.7, 1, 4000))
        )
    scenario = Scenario(
        model="llama-3.1-70b", prefill_tp=4, decode_tp=4, ttft=2.0, tpot=0.04, duration=duration
    )
    return scenario, requests


GENERATORS: dict[str, Callable[[int], tuple[Scenario, list[Request]]]] = {
    "chat-wave": chat_wave,
    "bursty-code": bursty_code,
    "diurnal-long": diurnal_long,
    "output-shift": output_shift,
}


def write_csv(requests: list[Request], path: Path) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["arrival_s", "input_tokens", "output_tokens"])
        for r in requests:
            writer.writerow([f"{r.arrival:.3f}", r.prompt_tokens, r.output_tokens])


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in GENERATORS:
        print(f"usage: traces.py {{{','.join(KINDS)}}} SEED OUT.csv", file=sys.stderr)
        sys.exit(2)
    write_csv(GENERATORS[sys.argv[1]](int(sys.argv[2]))[1], Path(sys.argv[3]))
