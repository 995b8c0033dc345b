"""The traffic a plan is for: a rate and length distributions, or a user's trace (pure).

The planner replays the same traffic at different rates to find how much one engine
serves, so a traffic description must be able to produce a seeded sample at any rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from disagg.sim.traffic import Request, Workload, generate

LENGTH_SPREAD: Final = 0.5
"""Lognormal sigma of prompt and output lengths around the given means."""
LENGTH_SAMPLE: Final = 300


class PlanInputError(ValueError):
    """The planner's input is wrong; the message says what and how to fix it."""


@dataclass(frozen=True)
class Traffic:
    """Requests per second and what they look like."""

    rate: float
    mean_prompt: float
    mean_output: float
    workload: Workload | None = None
    trace: tuple[Request, ...] = ()

    @cached_property
    def longest(self) -> tuple[int, int]:
        """The longest prompt, and prompt plus output, of a sample: what engines must hold."""
        sample = self.sample(self.rate, LENGTH_SAMPLE)
        return (
            max((r.prompt_tokens for r in sample), default=1),
            max((r.prompt_tokens + r.output_tokens for r in sample), default=1),
        )

    def sample(self, rate: float, count: int, seed: int = 1) -> list[Request]:
        """About ``count`` requests arriving at ``rate`` per second."""
        if self.trace:
            return _replay(self.trace, rate, count)
        assert self.workload is not None
        return generate(self.workload, rate, count / rate, seed=seed)


def synthetic(
    rate: float, input_tokens: int, output_tokens: int, spread: float = LENGTH_SPREAD
) -> Traffic:
    """Poisson arrivals; lognormal lengths whose means are the given token counts."""
    if rate <= 0:
        raise PlanInputError(f"--rate must be greater than zero requests per second, got {rate}")
    for flag, value in (("--input-tokens", input_tokens), ("--output-tokens", output_tokens)):
        if value < 1:
            raise PlanInputError(f"{flag} must be at least 1 token, got {value}")
    if spread < 0:
        raise PlanInputError(f"the length spread must be >= 0, got {spread}")
    workload = Workload(
        prompt_mu=math.log(input_tokens) - spread**2 / 2,
        prompt_sigma=spread,
        prompt_max=input_tokens * 8,
        output_mu=math.log(output_tokens) - spread**2 / 2,
        output_sigma=spread,
        output_max=output_tokens * 8,
    )
    return Traffic(rate, float(input_tokens), float(output_tokens), workload=workload)


def from_trace(requests: list[Request], rate: float | None = None) -> Traffic:
    """A user's trace, replayed at its own rate or rescaled in time to ``rate``."""
    if len(requests) < 2:
        raise PlanInputError("the trace needs at least two requests to have a rate")
    span = requests[-1].arrival - requests[0].arrival
    if span <= 0:
        raise PlanInputError("every request of the trace arrives at the same time; no rate")
    if rate is not None and rate <= 0:
        raise PlanInputError(f"--rate must be greater than zero requests per second, got {rate}")
    own = (len(requests) - 1) / span
    return Traffic(
        rate if rate is not None else own,
        sum(r.prompt_tokens for r in requests) / len(requests),
        sum(r.output_tokens for r in requests) / len(requests),
        trace=tuple(requests),
    )


def _replay(trace: tuple[Request, ...], rate: float, count: int) -> list[Request]:
    """The trace's first ``count`` requests (repeated if short), time-scaled to ``rate``."""
    span = trace[-1].arrival - trace[0].arrival
    own = (len(trace) - 1) / span
    scale = own / rate
    out: list[Request] = []
    lap = 0
    while len(out) < count:
        offset = lap * (span + span / max(1, len(trace) - 1))
        for r in trace:
            if len(out) == count:
                break
            out.append(Request((r.arrival + offset) * scale, r.prompt_tokens, r.output_tokens))
        lap += 1
    return out
