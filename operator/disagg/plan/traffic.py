"""The traffic a plan is for: a user's trace, or one generated from a rate and means (pure).

A plan is sized on a trace either way, so its peaks and length tails decide the size: a
mean-shape description becomes a seeded trace with Poisson (or burstier) arrivals and
lognormal lengths. The per-engine searches of :mod:`disagg.plan.search` replay the same
traffic at other rates, so a description also produces a seeded sample at any rate.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from disagg.sim.results import length_stats
from disagg.sim.traffic import Request, Workload, generate

LENGTH_SPREAD: Final = 0.8
"""Lognormal sigma of prompt and output lengths around the given means (chat traces such as
Azure's conversation trace measure 0.9-1.0)."""
SYNTHETIC_REQUESTS: Final = 6000
SYNTHETIC_SECONDS: Final = (300.0, 3600.0)
"""A generated trace holds about SYNTHETIC_REQUESTS, and lasts within these bounds."""


class PlanInputError(ValueError):
    """The planner's input is wrong; the message says what and how to fix it."""


@dataclass(frozen=True)
class Traffic:
    """Requests per second and what they look like."""

    rate: float
    mean_prompt: float
    mean_output: float
    trace: tuple[Request, ...]
    """What the plan is sized on: the user's trace, or one generated from ``workload``."""
    source: str = "synthetic"
    """The trace's file name, or ``synthetic``."""
    workload: Workload | None = None

    @cached_property
    def longest(self) -> tuple[int, int]:
        """The longest prompt, and prompt plus output: what engines must hold."""
        return (
            max((r.prompt_tokens for r in self.trace), default=1),
            max((r.prompt_tokens + r.output_tokens for r in self.trace), default=1),
        )

    @property
    def duration(self) -> float:
        return self.trace[-1].arrival - self.trace[0].arrival if self.trace else 0.0

    def sample(self, rate: float, count: int, seed: int = 1) -> list[Request]:
        """About ``count`` requests arriving at ``rate`` per second."""
        if self.workload is None:
            return _replay(self.trace, rate, count)
        return generate(self.workload, rate, count / rate, seed=seed)

    def regenerated(self, seed: int) -> list[Request]:
        """The same shape of traffic drawn again (a user's trace is what it is)."""
        if self.workload is None:
            return list(self.trace)
        return generate(self.workload, self.rate, _synthetic_seconds(self.rate), seed=seed)

    def describe(self) -> str:
        """One line: where the traffic comes from, its rate, span and length statistics."""
        _, prompt_p99 = length_stats([r.prompt_tokens for r in self.trace])
        _, output_p99 = length_stats([r.output_tokens for r in self.trace])
        shape = ""
        if self.workload is not None:
            arrivals = (
                "Poisson arrivals"
                if self.workload.burstiness == 1
                else f"arrivals with CV {self.workload.burstiness:g}"
            )
            shape = f" ({arrivals}, lognormal lengths sigma {self.workload.prompt_sigma:g})"
        return (
            f"{self.source}{shape}: {len(self.trace)} requests over {self.duration:.0f}s "
            f"({self.rate:.3g} req/s); prompt tokens mean {self.mean_prompt:.0f}, "
            f"p99 {prompt_p99}; output tokens mean {self.mean_output:.0f}, p99 {output_p99}"
        )


def _synthetic_seconds(rate: float) -> float:
    low, high = SYNTHETIC_SECONDS
    return min(high, max(low, SYNTHETIC_REQUESTS / rate))


def synthetic(
    rate: float,
    input_tokens: int,
    output_tokens: int,
    spread: float = LENGTH_SPREAD,
    arrival_cv: float = 1.0,
    seed: int = 1,
) -> Traffic:
    """Gamma arrivals (Poisson at CV 1); lognormal lengths whose means are the given counts."""
    if rate <= 0:
        raise PlanInputError(f"--rate must be greater than zero requests per second, got {rate}")
    for flag, value in (("--input-tokens", input_tokens), ("--output-tokens", output_tokens)):
        if value < 1:
            raise PlanInputError(f"{flag} must be at least 1 token, got {value}")
    if not 0 <= spread <= 3:
        raise PlanInputError(f"--length-spread must be between 0 and 3, got {spread}")
    if not 0 < arrival_cv <= 10:
        raise PlanInputError(f"--arrival-cv must be in (0, 10], got {arrival_cv}")
    workload = Workload(
        prompt_mu=math.log(input_tokens) - spread**2 / 2,
        prompt_sigma=spread,
        prompt_max=input_tokens * 8,
        output_mu=math.log(output_tokens) - spread**2 / 2,
        output_sigma=spread,
        output_max=output_tokens * 8,
        burstiness=arrival_cv,
    )
    trace = generate(workload, rate, _synthetic_seconds(rate), seed=seed)
    if len(trace) < 2:
        raise PlanInputError(f"--rate {rate:g} is too low to generate traffic to plan for")
    return Traffic(rate, float(input_tokens), float(output_tokens), tuple(trace), workload=workload)


def from_trace(
    requests: list[Request], rate: float | None = None, source: str = "trace"
) -> Traffic:
    """A user's trace, at its own rate or rescaled in time to ``rate``."""
    if len(requests) < 2:
        raise PlanInputError("the trace needs at least two requests to have a rate")
    span = requests[-1].arrival - requests[0].arrival
    if span <= 0:
        raise PlanInputError("every request of the trace arrives at the same time; no rate")
    if rate is not None and rate <= 0:
        raise PlanInputError(f"--rate must be greater than zero requests per second, got {rate}")
    own = (len(requests) - 1) / span
    first = requests[0].arrival
    scale = own / rate if rate is not None else 1.0
    trace = tuple(
        Request((r.arrival - first) * scale, r.prompt_tokens, r.output_tokens) for r in requests
    )
    return Traffic(
        rate if rate is not None else own,
        sum(r.prompt_tokens for r in requests) / len(requests),
        sum(r.output_tokens for r in requests) / len(requests),
        trace,
        source=source,
    )


def _replay(trace: tuple[Request, ...], rate: float, count: int) -> list[Request]:
    """``count`` requests drawn evenly across the whole trace (so its tails are in), in the
    trace's order, arriving at ``rate`` with the trace's own gaps between them."""
    stride = max(1, len(trace) // max(1, count))
    picked = [trace[(i * stride) % len(trace)] for i in range(count)]
    gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(trace)]
    mean_gap = sum(gaps) / len(gaps)
    out, t = [], 0.0
    for i, r in enumerate(picked):
        out.append(Request(t, r.prompt_tokens, r.output_tokens))
        t += gaps[(i * stride) % len(gaps)] / mean_gap / rate
    return out
