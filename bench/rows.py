"""One policy's run as a row of the compare benches (``autoscaler_compare.py`` and the
baselines it tunes, ``tuned_baselines.py``): attainment, p99s, GPU-hours, actions, flaps."""

from __future__ import annotations

import math
from typing import Any

from disagg.sim.results import Result, flaps, latencies
from disagg.sim.scenario import Scenario
from disagg.slo import percentile


def result_row(name: str, scenario: Scenario, result: Result) -> dict[str, Any]:
    both = result.attainment(scenario.ttft, scenario.tpot)[2]
    ttft = percentile(latencies(result.outcomes, "ttft"), 0.99)
    tpot = percentile(latencies(result.outcomes, "tpot"), 0.99)
    return {
        "policy": name,
        "attainment": both,
        "gpuHours": result.gpu_seconds / 3600,
        "gpuHoursByPool": {pool: gpus / 3600 for pool, gpus in result.pool_gpu_seconds.items()},
        "ttftP99": finite(ttft),
        "tpotP99": finite(tpot),
        "actions": result.scaling_actions,
        "flaps": flaps(result.scaling_log),
        "refused": sum(1 for o in result.outcomes if o.rejected),
    }


def finite(value: float | None) -> float | None:
    """A p99 with over 1% of requests never served is infinite: no number to print (as
    ``disagg simulate`` prints it), and not one JSON can carry."""
    return None if value is None or not math.isfinite(value) else value
