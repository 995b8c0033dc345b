"""What a plan is asked and what it answers: the request, the options, the plan (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from disagg.perf.profiles import GpuProfile, ModelProfile
from disagg.perf.roofline import EngineShape, NetworkProfile, StepTime, step_time
from disagg.plan.sizing import Sizing
from disagg.plan.traffic import Traffic
from disagg.plan.windows import WINDOW, Context
from disagg.sim.fleet import Mode
from disagg.sim.traffic import Request
from disagg.slo import Slo

TP_DEGREES: Final = (1, 2, 4, 8)
BUDGETS: Final = (512, 2048, 8192)
DEFAULT_BUDGET: Final = 2048

SPLIT_MARGIN: Final = 0.1
"""Disaggregation must save this share of GPUs (or add this much goodput per GPU)."""


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
    window: float = WINDOW
    """Seconds a new replica takes to serve: the span a static size must carry."""

    def context(self, requests: Sequence[Request] | None = None) -> Context:
        """What every simulation of this plan shares, over the trace (or ``requests``)."""
        return Context(
            tuple(self.traffic.trace if requests is None else requests),
            self.slo.ttft,
            self.slo.tpot,
            self.slo.attainment,
            self.network,
            self.step_time,
            window=self.window,
        )


@dataclass(frozen=True)
class Prediction:
    """A sized deployment judged on the trace's simulated windows."""

    attainment: float
    ttft_p99: float
    tpot_p99: float
    goodput_per_gpu: float


@dataclass(frozen=True)
class Option:
    """One deployment considered."""

    mode: Mode
    decode_tp: int
    prefill_tp: int = 0
    max_num_batched_tokens: int = 2048
    goodput_per_gpu: float = 0.0
    """Requests/s meeting both SLOs over the trace, per GPU (closed form when not sized)."""
    prefill_replicas: int = 0
    decode_replicas: int = 0
    prediction: Prediction | None = None
    """From the simulated peak windows; None for a closed-form size."""
    within_budget: bool = True
    reaches_goal: bool = False
    """Sized by simulation and meets the plan's target (the best any shape reaches)."""
    sizing: Sizing | None = field(default=None, compare=False, repr=False)

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
    goal: float = 0.0
    """The attainment the chosen size was searched for: the target, or half a point under
    the best ceiling any shape reaches when the target is out of reach."""


def engine_shape(request: PlanRequest, tp: int) -> EngineShape:
    return EngineShape(request.model, request.gpu, tp)
