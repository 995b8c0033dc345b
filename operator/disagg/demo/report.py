"""The demo's summary: per phase and pool, as a table, as JSON, and as a PNG timeline."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disagg.demo.stack import LoadReport
from disagg.demo.story import Phase


@dataclass
class Sample:
    """One second of the demo: replicas and the p99s the autoscaler saw."""

    t: float
    phase: str
    replicas: dict[str, int]
    ready: dict[str, int]
    ttft_p99: float | None
    tpot_p99: float | None
    reason: str = ""


@dataclass
class PhaseResult:
    phase: Phase
    started: float
    ended: float
    load: LoadReport | None = None
    samples: list[Sample] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def summarize(
    results: list[PhaseResult], ttft_slo: float, tpot_slo: float, gpus: dict[str, int]
) -> dict[str, Any]:
    """The summary as plain data (what --json prints and summary.json holds)."""
    phases = []
    actions = 0
    gpu_seconds = 0.0
    previous: dict[str, int] | None = None
    for result in results:
        pools = {}
        for role in ("prefill", "decode"):
            counts = [s.replicas[role] for s in result.samples] or [0]
            pools[role] = {
                "start": counts[0],
                "highest": max(counts),
                "lowest": min(counts),
                "end": counts[-1],
            }
        load = result.load
        ttft_ok, tpot_ok = load.attainment(ttft_slo, tpot_slo) if load and load.ok else (None, None)
        for a, b in zip(result.samples, result.samples[1:], strict=False):
            gpu_seconds += (b.t - a.t) * sum(a.replicas[r] * gpus[r] for r in gpus)
        for sample in result.samples:
            if previous is not None and sample.replicas != previous:
                actions += 1
            previous = sample.replicas
        phases.append(
            {
                "phase": result.phase.name,
                "title": result.phase.title,
                "expect": result.phase.expect,
                "seconds": round(result.ended - result.started, 1),
                "pools": pools,
                "requests": load.sent if load else 0,
                "failed_requests": load.failed if load else 0,
                "ttft_p99_seconds": _percentile(load.ttfts, 0.99) if load else None,
                "tpot_p99_seconds": _percentile(load.tpots, 0.99) if load else None,
                "ttft_attainment": ttft_ok,
                "tpot_attainment": tpot_ok,
            }
        )
    return {
        "slo": {"ttft_p99_seconds": ttft_slo, "tpot_p99_seconds": tpot_slo},
        "gpu_minutes": round(gpu_seconds / 60, 2),
        "scaling_actions": actions,
        "failed_requests": sum(p["failed_requests"] for p in phases),
        "phases": phases,
    }


def _pool(phase: dict[str, Any], role: str) -> str:
    x = phase["pools"][role]
    return f"{x['start']}->{x['highest']}->{x['end']}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def table(summary: dict[str, Any]) -> str:
    """The summary as a fixed-width table."""
    slo = summary["slo"]
    lines = [
        f"SLOs: TTFT p99 {slo['ttft_p99_seconds']:g}s, "
        f"TPOT p99 {slo['tpot_p99_seconds'] * 1000:g}ms (measured at the load generator)",
        f"{'phase':<13} {'prefill':>14} {'decode':>14} {'TTFT p99':>9} {'TPOT p99':>9} "
        f"{'TTFT ok':>8} {'TPOT ok':>8} {'failed':>7}",
    ]
    for p in summary["phases"]:
        lines.append(
            f"{p['phase']:<13} {_pool(p, 'prefill'):>14} {_pool(p, 'decode'):>14} "
            f"{_secs(p['ttft_p99_seconds']):>9} {_millis(p['tpot_p99_seconds']):>9} "
            f"{_pct(p['ttft_attainment']):>8} {_pct(p['tpot_attainment']):>8} "
            f"{p['failed_requests']:>7}"
        )
    lines.append(
        f"GPU-minutes {summary['gpu_minutes']:.2f}, scaling actions {summary['scaling_actions']}, "
        f"failed requests {summary['failed_requests']}"
    )
    return "\n".join(lines)


def write(
    summary: dict[str, Any], results: list[PhaseResult], out: Path, ttft_slo: float, tpot_slo: float
) -> tuple[Path, Path]:
    """summary.json and timeline.png under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "summary.json"
    json_path.write_text(json.dumps(summary, indent=2) + "\n")
    samples = [s for r in results for s in r.samples]
    t = [s.t for s in samples]
    fig, (ax_r, ax_t, ax_p) = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True)
    for role, color in (("prefill", "tab:orange"), ("decode", "tab:blue")):
        ax_r.step(
            t,
            [s.replicas[role] for s in samples],
            where="post",
            label=f"{role} replicas",
            color=color,
        )
    ax_r.set_ylabel("replicas")
    ax_r.legend(loc="upper left")
    ax_t.plot(
        t,
        [s.ttft_p99 if s.ttft_p99 is not None else float("nan") for s in samples],
        color="tab:orange",
        label="TTFT p99 (prefill pool)",
    )
    ax_t.axhline(ttft_slo, color="tab:orange", linestyle="--", label=f"TTFT SLO {ttft_slo:g}s")
    ax_t.set_ylabel("seconds")
    ax_t.legend(loc="upper left")
    ax_p.plot(
        t,
        [s.tpot_p99 * 1000 if s.tpot_p99 is not None else float("nan") for s in samples],
        color="tab:blue",
        label="TPOT p99 (decode pool)",
    )
    ax_p.axhline(
        tpot_slo * 1000, color="tab:blue", linestyle="--", label=f"TPOT SLO {tpot_slo * 1000:g}ms"
    )
    ax_p.set_ylabel("milliseconds")
    ax_p.set_xlabel("seconds since the story started")
    ax_p.legend(loc="upper left")
    for result in results:
        start = result.samples[0].t if result.samples else 0
        for ax in (ax_r, ax_t, ax_p):
            ax.axvline(start, color="grey", linewidth=0.6)
        ax_r.annotate(
            result.phase.title, (start, 1), xytext=(3, 3), textcoords="offset points", fontsize=8
        )
    fig.suptitle("disagg-operator demo: each pool scales on its own SLO")
    fig.tight_layout()
    png_path = out / "timeline.png"
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path
