"""The engines' default histogram buckets: vLLM's (vllm/v1/metrics/buckets.py), which the
simulator exports, and SGLang's latency ones (its metrics collector's defaults). The
autoscaler reasons about the coarseness of the ones its p99s are read from."""

from __future__ import annotations

from typing import Final

TTFT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS: Final = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS: Final = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                                  7680.0)  # fmt: skip
SGLANG_TTFT_BUCKETS: Final = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0,
                               60.0, 80.0, 100.0, 200.0, 400.0)  # fmt: skip
SGLANG_ITL_BUCKETS: Final = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035,
                              0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0,
                              8.0)  # fmt: skip
LATENCY_BUCKETS: Final = {
    "vllm": {"prefill": TTFT_BUCKETS, "decode": ITL_BUCKETS},
    "sglang": {"prefill": SGLANG_TTFT_BUCKETS, "decode": SGLANG_ITL_BUCKETS},
}
"""By engine and phase: the bounds of the histogram a pool's latency p99 is read from (TTFT
for prefill, inter-token latency for decode)."""
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
