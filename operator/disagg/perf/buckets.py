"""vLLM's default histogram buckets (vllm/v1/metrics/buckets.py): the simulator exports them
and the autoscaler reasons about their coarseness."""

from __future__ import annotations

from typing import Final

TTFT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS: Final = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS: Final = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                                  7680.0)  # fmt: skip
SIM_MAX_MODEL_LEN: Final = 131_072
"""The simulated engines' context length (Llama-3.1's), which bounds vLLM's length buckets."""


def length_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_model_len``, the
    bounds of its prompt- and output-length histograms (``vllm:request_prompt_tokens``)."""
    bounds: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(bounds)
            bounds.append(float(mantissa * scale))
        scale *= 10
