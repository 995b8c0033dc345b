"""``disagg plan --verify``: the recommendation replayed through the whole deployment (pure).

The plan's prediction comes from simulating the trace's peak windows; the replay simulates
every request of the trace (or, for a plan made from means, traffic of the same shape drawn
with another seed) at the recommended size, so the two can be compared.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final

from disagg.plan.model import Plan, PlanRequest
from disagg.plan.windows import fleet
from disagg.sim.baselines import MARGIN
from disagg.sim.fleet import simulate
from disagg.sim.results import latencies
from disagg.slo import percentile

AGREEMENT: Final = 0.02
"""Predicted and replayed attainment must agree within two points."""
SHORTFALL: Final = MARGIN
"""And the replay may fall under the goal the size was searched for by at most this much:
a prediction one and a half points high on a goal half a point under the ceiling is a size
that misses what the plan promised, though it agrees within two points."""
REPLAY_SEED: Final = 2


@dataclass(frozen=True)
class Replay:
    """Predicted against replayed attainment of one recommendation."""

    traffic: str
    requests: int
    predicted: float
    replayed: float
    ttft_p99: float
    tpot_p99: float
    goal: float = 0.0
    """The attainment the size was searched for."""

    @property
    def agrees(self) -> bool:
        return abs(self.predicted - self.replayed) <= AGREEMENT and not self.short

    @property
    def short(self) -> bool:
        return self.replayed < self.goal - SHORTFALL

    def describe(self) -> str:
        verdict = (
            "agree"
            if self.agrees
            else f"DISAGREE: the replay misses the {self.goal:.1%} the size was planned for"
            if self.short
            else f"DISAGREE by more than {AGREEMENT * 100:g} points: size from the replay"
        )
        return (
            f"verify: replayed {self.requests} requests ({self.traffic}) through the "
            f"recommended deployment: {self.replayed:.1%} within both SLOs, predicted "
            f"{self.predicted:.1%} ({verdict}); TTFT p99 {self.ttft_p99:.3f}s, TPOT p99 "
            f"{self.tpot_p99 * 1000:.1f}ms\n"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "traffic": self.traffic,
            "requests": self.requests,
            "predictedAttainment": round(self.predicted, 4),
            "replayedAttainment": round(self.replayed, 4),
            "goal": round(self.goal, 4),
            "agrees": self.agrees,
            "ttftP99": round(self.ttft_p99, 4),
            "tpotP99": round(self.tpot_p99, 5),
        }


def verify(result: Plan, request: PlanRequest, executor: Executor | None = None) -> Replay:
    """Simulate the chosen deployment on all of the traffic (in ``executor`` if given)."""
    chosen, traffic, slo = result.chosen, request.traffic, request.slo
    assert chosen.sizing is not None and chosen.prediction is not None
    requests = traffic.regenerated(REPLAY_SEED)
    config = fleet(request.context(requests), chosen.sizing.candidate, chosen.sizing.sizes)
    run = (
        simulate(config, requests)
        if executor is None
        else executor.submit(simulate, config, requests).result()
    )
    return Replay(
        "the same trace"
        if traffic.workload is None
        else f"the same shape drawn again, seed {REPLAY_SEED}",
        len(requests),
        chosen.prediction.attainment,
        run.attainment(slo.ttft, slo.tpot)[2],
        percentile(latencies(run.outcomes, "ttft"), 0.99) or 0.0,
        percentile(latencies(run.outcomes, "tpot"), 0.99) or 0.0,
        result.goal,
    )
