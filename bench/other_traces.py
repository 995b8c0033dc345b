"""Trace shapes the SLO policy was not written against, for checking it on new traffic.

bench/traces.py holds the four kinds the policy is judged on seed after seed. These are
other shapes users bring, kept apart so that no rule is tuned on them:

* ``ramp-stop``: 70B chat at TP4 ramping from 1 to 12 req/s over 30 minutes, holding five,
  then no traffic for ten minutes, then 3 req/s;
* ``agentic``: 8B with prompts of about 4k tokens and outputs of about 1k, a 2-6 req/s
  sinusoid with bursty (Gamma, CV 2) arrivals;
* ``periodic``: 8B chat at 14 req/s with a 2-minute burst to 40 req/s every ten minutes,
  the first five minutes in;
* ``low-rate``: 70B long context at TP8, 0.15 req/s;
* ``square``: 8B chat alternating 3 and 12 req/s every 15 minutes;
* ``decline``: 70B chat at TP4 falling from 10 to 1 req/s over 40 minutes, then 1;
* ``lengthening``: 8B chat at 5 req/s whose outputs grow from about 150 to 1200 tokens
  over the hour;
* ``rag``: 70B at TP8 with retrieved context, 6-20k-token prompts (3% of 60-120k) and short
  outputs, 1 req/s doubling at 30 minutes;
* ``bimodal``: 70B chat at TP4 with 8% of the prompts 15-28k tokens long (documents to
  summarize), 1.5-3.5 req/s over the hour: the long prompts' prefill alone comes near the
  4 s TTFT SLO, inside one coarse bucket of the prefill-time histogram;
* ``flash-crowd``: 8B chat at 4 req/s, rising within a minute to 16 at 20 minutes, for ten
  minutes;
* ``day``: 8B chat over one smooth day compressed into an hour, 6 req/s rising to 18 at
  half past and back, at a 1 s TTFT SLO: one replica per pool serves the peak at the edge of
  its SLO.

``python bench/other_traces.py KIND SEED OUT.csv`` writes one and prints the
``autoscaler_compare.py --trace`` flags for its deployment.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traces import _arrivals, _lognormal, write_csv

from disagg.sim.traffic import Request

HOUR = 3600.0


@dataclass(frozen=True)
class Deployment:
    """What a trace is served by: the flags autoscaler_compare.py --trace takes."""

    model: str
    tp: int
    ttft: float
    tpot: float

    def flags(self) -> str:
        return (
            f"--model {self.model} --prefill-tp {self.tp} --decode-tp {self.tp} "
            f"--ttft {self.ttft:g} --tpot {self.tpot:g}"
        )


def ramp_stop(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        if t < 1800:
            return 1 + 11 * t / 1800
        if t < 2100:
            return 12.0
        return 0.0 if t < 2700 else 3.0

    return [
        Request(t, _lognormal(rng, 6.8, 0.9, 16, 12000), _lognormal(rng, 5.0, 0.8, 1, 2000))
        for t in _arrivals(rng, rate, 12.0, HOUR, 1.0)
    ]


def agentic(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        return 4 + 2 * math.sin(2 * math.pi * t / HOUR - math.pi / 2)

    return [
        Request(t, _lognormal(rng, 8.0, 0.8, 256, 32000), _lognormal(rng, 6.5, 0.9, 16, 8000))
        for t in _arrivals(rng, rate, 6.0, HOUR, 2.0)
    ]


def periodic(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        return 40.0 if 300 <= t % 600 < 420 else 14.0

    return [
        Request(t, _lognormal(rng, 6.5, 1.0, 16, 16000), _lognormal(rng, 5.3, 0.8, 1, 2000))
        for t in _arrivals(rng, rate, 40.0, HOUR, 1.0)
    ]


def low_rate(rng: random.Random) -> list[Request]:
    return [
        Request(t, _lognormal(rng, 8.3, 0.6, 256, 30000), _lognormal(rng, 5.5, 0.7, 1, 2000))
        for t in _arrivals(rng, lambda _: 0.15, 0.15, HOUR, 1.5)
    ]


def square(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        return 12.0 if (t // 900) % 2 else 3.0

    return [
        Request(t, _lognormal(rng, 6.7, 1.0, 16, 16000), _lognormal(rng, 5.2, 0.8, 1, 2000))
        for t in _arrivals(rng, rate, 12.0, HOUR, 1.0)
    ]


def decline(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        return max(1.0, 10 - 9 * t / 2400)

    return [
        Request(t, _lognormal(rng, 6.9, 0.9, 16, 12000), _lognormal(rng, 5.0, 0.8, 1, 2000))
        for t in _arrivals(rng, rate, 10.0, HOUR, 1.0)
    ]


def lengthening(rng: random.Random) -> list[Request]:
    requests = []
    for t in _arrivals(rng, lambda _: 5.0, 5.0, HOUR, 1.0):
        prompt = _lognormal(rng, 6.5, 0.9, 16, 8000)
        requests.append(Request(t, prompt, _lognormal(rng, 5.0 + 2.1 * t / HOUR, 0.9, 1, 8000)))
    return requests


def rag(rng: random.Random) -> list[Request]:
    requests = []
    for t in _arrivals(rng, lambda t: 1.0 if t < HOUR / 2 else 2.0, 2.0, HOUR, 1.3):
        long = rng.random() < 0.03
        prompt = rng.randint(60000, 120000) if long else rng.randint(6000, 20000)
        requests.append(Request(t, prompt, _lognormal(rng, 4.5, 0.7, 1, 1000)))
    return requests


def bimodal(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        return 2.5 + math.sin(2 * math.pi * t / HOUR)

    requests = []
    for t in _arrivals(rng, rate, 3.5, HOUR, 1.2):
        if rng.random() < 0.08:
            requests.append(
                Request(t, rng.randint(15000, 28000), _lognormal(rng, 5.5, 0.5, 16, 1500))
            )
        else:
            requests.append(
                Request(t, _lognormal(rng, 6.5, 0.9, 16, 8000), _lognormal(rng, 5.0, 0.8, 1, 2000))
            )
    return requests


def flash_crowd(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        if 1200 <= t < 1260:
            return 4 + 12 * (t - 1200) / 60
        return 16.0 if 1260 <= t < 1860 else 4.0

    return [
        Request(t, _lognormal(rng, 6.6, 1.0, 16, 16000), _lognormal(rng, 5.1, 0.8, 1, 2000))
        for t in _arrivals(rng, rate, 16.0, HOUR, 1.0)
    ]


def day(rng: random.Random) -> list[Request]:
    def rate(t: float) -> float:
        return 12 - 6 * math.cos(2 * math.pi * t / HOUR)

    return [
        Request(t, _lognormal(rng, 6.8, 0.9, 16, 16000), _lognormal(rng, 5.0, 0.8, 1, 2000))
        for t in _arrivals(rng, rate, 18.0, HOUR, 1.0)
    ]


SHAPES: dict[str, tuple[Callable[[random.Random], list[Request]], Deployment]] = {
    "ramp-stop": (ramp_stop, Deployment("llama-3.1-70b", 4, 2.0, 0.04)),
    "agentic": (agentic, Deployment("llama-3.1-8b", 1, 3.0, 0.03)),
    "periodic": (periodic, Deployment("llama-3.1-8b", 1, 2.0, 0.05)),
    "low-rate": (low_rate, Deployment("llama-3.1-70b", 8, 3.0, 0.05)),
    "square": (square, Deployment("llama-3.1-8b", 1, 2.0, 0.04)),
    "decline": (decline, Deployment("llama-3.1-70b", 4, 2.0, 0.04)),
    "lengthening": (lengthening, Deployment("llama-3.1-8b", 1, 1.5, 0.03)),
    "rag": (rag, Deployment("llama-3.1-70b", 8, 4.0, 0.05)),
    "bimodal": (bimodal, Deployment("llama-3.1-70b", 4, 4.0, 0.05)),
    "flash-crowd": (flash_crowd, Deployment("llama-3.1-8b", 1, 1.5, 0.04)),
    "day": (day, Deployment("llama-3.1-8b", 1, 1.0, 0.04)),
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in SHAPES or not argv[1].lstrip("-").isdigit():
        print(f"usage: other_traces.py {{{','.join(SHAPES)}}} SEED OUT.csv", file=sys.stderr)
        return 2
    generate, deployment = SHAPES[argv[0]]
    out = Path(argv[2])
    write_csv(generate(random.Random(int(argv[1]))), out)
    print(f"bench/autoscaler_compare.py --trace {out} {deployment.flags()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
