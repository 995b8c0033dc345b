"""DistServe-style fitted latency models: measured coefficients instead of the roofline (pure).

DistServe's simulator times a prefill step as ``a + b*sum(l) + c*sum(l^2)`` milliseconds over
the prompt chunks ``l`` and a decode step as ``a + b*sum(ctx) + c*B`` over the batch's context
lengths, with a second decode fit for batches of 95 and more. The coefficients below are the
ones its artifact publishes for OPT-13B on A100-80GB (``profiler-a100-80g.distserve.json``);
they make the fleet simulator comparable with the paper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from disagg.perf.roofline import (
    EngineShape,
    PrefillChunk,
    StepTime,
    decode_step_time,
    step_time,
)

LARGE_BATCH: Final = 95

Coefficients = tuple[float, float, float]


@dataclass(frozen=True)
class FittedPhases:
    """One engine shape's fitted coefficients (milliseconds)."""

    prefill: Coefficients
    decode: Coefficients
    decode_large_batch: Coefficients | None = None

    def step_ms(self, chunks: Sequence[PrefillChunk], contexts: Sequence[int]) -> float:
        """A step that carries both parts (colocated) pays both."""
        ms = 0.0
        if chunks:
            a, b, c = self.prefill
            lengths = [x.new_tokens for x in chunks]
            ms += a + b * sum(lengths) + c * sum(n * n for n in lengths)
        if contexts:
            ms += self.decode_ms(len(contexts), sum(contexts))
        return ms

    def decode_ms(self, batch: int, context: int) -> float:
        """A decode-only step of ``batch`` sequences holding ``context`` tokens in all."""
        large = self.decode_large_batch if batch >= LARGE_BATCH else None
        a, b, c = large or self.decode
        return a + b * context + c * batch


@dataclass(frozen=True)
class FittedModel:
    """A step-time function over fitted phases, chosen by the engine's TP degree."""

    name: str
    by_tp: Mapping[int, FittedPhases]

    def __call__(
        self, shape: EngineShape, chunks: Sequence[PrefillChunk], contexts: Sequence[int]
    ) -> float:
        return self._phases(shape).step_ms(chunks, contexts) / 1000

    def _phases(self, shape: EngineShape) -> FittedPhases:
        phases = self.by_tp.get(shape.tp)
        if phases is None:
            raise ValueError(
                f"the fitted model {self.name} has coefficients for TP "
                f"{sorted(self.by_tp)}, not TP {shape.tp}"
            )
        return phases

    def decode_step_time(self, shape: EngineShape, batch: int, context: int) -> float:
        """A decode-only step by its batch and total context, as :func:`decode_step_model`."""
        return self._phases(shape).decode_ms(batch, context) / 1000


DISTSERVE_OPT13B_A100: Final = FittedModel(
    "distserve-opt-13b-a100",
    {  # TP: prefill (a, b, c), decode batch < 95 (a, b, c), decode batch >= 95 (a, b, c)
        1: FittedPhases(
            (18.10, 0.1019, 7.12e-6), (19.93, 6.27e-4, 0.0385), (7.17, 5.80e-4, 0.158)
        ),
        2: FittedPhases(
            (14.74, 0.0686, 2.45e-6), (13.29, 3.41e-4, 0.0630), (10.64, 3.12e-4, 0.0856)
        ),
        4: FittedPhases(
            (12.06, 0.0381, 5.23e-7), (10.26, 1.88e-4, 0.0327), (10.48, 1.71e-4, 0.0457)
        ),
    },
)  # fmt: skip
"""OPT-13B on A100-80GB at TP 1, 2 and 4, from DistServe's released profile."""

FITTED_MODELS: Final[dict[str, FittedModel]] = {DISTSERVE_OPT13B_A100.name: DISTSERVE_OPT13B_A100}
LATENCY_MODELS: Final = ("roofline", *sorted(FITTED_MODELS))


DecodeStepTime = Callable[[EngineShape, int, int], float]
"""Seconds of one decode-only step from its batch size and the batch's total context."""


def decode_step_model(model: StepTime) -> DecodeStepTime:
    """The decode-only form of a latency model. Both models here time such a step by its
    batch and total context alone; any other model is asked with the total as one context."""
    if model is step_time:
        return decode_step_time
    if isinstance(model, FittedModel):
        return model.decode_step_time
    return lambda shape, batch, context: model(shape, (), [context, *[0] * (batch - 1)])


def latency_model(name: str) -> StepTime:
    """The roofline or a fitted model by name; KeyError names the known ones."""
    if name == "roofline":
        return step_time
    if name not in FITTED_MODELS:
        raise KeyError(f"unknown latency model {name!r}; known: {', '.join(LATENCY_MODELS)}")
    return FITTED_MODELS[name]
