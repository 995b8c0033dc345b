"""PNG plots of a fleet simulation: replicas, latency p99 against the SLOs, and load."""

from __future__ import annotations

import math
from pathlib import Path

from disagg.sim.fleet import pools_of
from disagg.sim.results import Result
from disagg.sim.scenario import Scenario, Summary


def write_timeline(scenario: Scenario, result: Result, summary: Summary, path: Path) -> Path:
    """Three stacked panels over simulated time, saved as ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_r, ax_t, ax_p, ax_l) = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    t = [s["t"] for s in result.timeline]
    pools = pools_of(scenario.mode)
    for pool, color in (("prefill", "tab:orange"), ("decode", "tab:blue")):
        if pool in pools:
            replicas = [s.get(f"{pool}_replicas", math.nan) for s in result.timeline]
            ax_r.step(t, replicas, where="post", color=color, label=f"{pool} replicas")
    ax_r.set_ylabel("replicas")
    ax_r.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_r.legend(loc="upper left")
    ax_r.set_title(
        f"{scenario.mode}, policy {scenario.policy}: {result.gpu_seconds / 3600:.2f} GPU-hours, "
        f"{result.scaling_actions} scaling actions"
    )
    buckets = summary.latency
    bt = [b["t"] for b in buckets]
    ax_t.plot(bt, [_nan(b["ttft_p99"]) for b in buckets], color="tab:orange", label="TTFT p99")
    ax_t.axhline(scenario.ttft, color="tab:orange", linestyle="--", label=f"SLO {scenario.ttft:g}s")
    ax_t.set_ylabel("seconds")
    ax_t.set_yscale("log")
    ax_t.legend(loc="upper left")
    ax_p.plot(bt, [_nan(b["tpot_p99"]) * 1000 for b in buckets], color="tab:blue", label="TPOT p99")
    ax_p.axhline(
        scenario.tpot * 1000,
        color="tab:blue",
        linestyle="--",
        label=f"SLO {scenario.tpot * 1000:g}ms",
    )
    ax_p.set_ylabel("milliseconds")
    ax_p.legend(loc="upper left")
    ax_l.plot(bt, [b["rate"] for b in buckets], color="tab:green", label="arrivals (req/s)")
    ax_l.set_ylabel("requests/s")
    ax_l.set_xlabel("simulated seconds (latency by arrival minute)")
    ax_l.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
