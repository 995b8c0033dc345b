"""The demo's summary: per phase and pool, as a table, as JSON, and as a PNG timeline; with
the colocated contrast model, its engine pool and latencies beside the split's, and the
contrast itself: each model's TPOT p99 in the long-prompt wave against its steady chat."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disagg.demo.load import LoadReport
from disagg.demo.story import Phase
from disagg.slo import percentile


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
    colocated_ttft_p99: float | None = None
    colocated_tpot_p99: float | None = None
    budget: str | None = None
    """The error budget left over the SLO window, as the Budget column shows it."""


@dataclass
class PhaseResult:
    phase: Phase
    started: float
    ended: float
    load: LoadReport | None = None
    samples: list[Sample] = field(default_factory=list)
    colocated_load: LoadReport | None = None
    """The same traffic, sent to the colocated contrast model."""
    engine_itl_p99: float | None = None
    """The split's worst 10 s inter-token latency p99 of the phase, from its engines' histogram."""
    colocated_engine_itl_p99: float | None = None


def _latencies(
    load: LoadReport | None, engine_itl: float | None, ttft_slo: float, tpot_slo: float
) -> dict[str, Any]:
    ttft_ok, tpot_ok = load.attainment(ttft_slo, tpot_slo) if load and load.ok else (None, None)
    return {
        "itl_p99_seconds": engine_itl,
        "requests": load.sent if load else 0,
        "failed_requests": load.failed if load else 0,
        "ttft_p99_seconds": percentile(load.ttfts, 0.99) if load else None,
        "tpot_p99_seconds": percentile(load.tpots, 0.99) if load else None,
        "client_itl_p99_seconds": percentile(load.gaps, 0.99) if load else None,
        "ttft_attainment": ttft_ok,
        "tpot_attainment": tpot_ok,
    }


CHAT, WAVE = "chat", "long-prompts"
"""The phases the contrast compares: steady chat, then the wave of long prompts."""


def _contrast(phases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each model's inter-token latency p99 in the wave as a multiple of its steady-chat
    value: every gap between two tokens as its engines timed them (a stalled step shows in
    full, where a request's mean time per token would average it away, and the host's
    scheduling of a busy two-core machine does not count)."""
    by_name = {p["phase"]: p for p in phases}
    if CHAT not in by_name or WAVE not in by_name or "colocated" not in by_name[WAVE]:
        return None
    wave, chat = by_name[WAVE], by_name[CHAT]
    sides = {
        "disaggregated": (chat["itl_p99_seconds"], wave["itl_p99_seconds"]),
        "colocated": (chat["colocated"]["itl_p99_seconds"], wave["colocated"]["itl_p99_seconds"]),
    }
    result = {}
    for model, (quiet, busy) in sides.items():
        result[model] = {
            "chat_itl_p99_seconds": quiet,
            "wave_itl_p99_seconds": busy,
            "wave_over_chat": round(busy / quiet, 2) if quiet and busy is not None else None,
        }
    return result


def summarize(
    results: list[PhaseResult], ttft_slo: float, tpot_slo: float, gpus: dict[str, int]
) -> dict[str, Any]:
    """The summary as plain data (what --json prints and summary.json holds); ``gpus`` per
    replica of each pool, ``engine`` for the colocated contrast model's."""
    phases = []
    actions = 0
    gpu_seconds = colocated_gpu_seconds = 0.0
    split = [r for r in gpus if r != "engine"]
    previous: dict[str, int] | None = None
    for result in results:
        pools = {}
        for role in gpus:
            counts = [s.replicas[role] for s in result.samples] or [0]
            pools[role] = {
                "start": counts[0],
                "highest": max(counts),
                "lowest": min(counts),
                "end": counts[-1],
            }
        for a, b in zip(result.samples, result.samples[1:], strict=False):
            gpu_seconds += (b.t - a.t) * sum(a.replicas[r] * gpus[r] for r in split)
            if "engine" in gpus:
                colocated_gpu_seconds += (b.t - a.t) * a.replicas["engine"] * gpus["engine"]
        for sample in result.samples:
            moved = {r: sample.replicas[r] for r in split}
            if previous is not None and moved != previous:
                actions += 1
            previous = moved
        phase = {
            "phase": result.phase.name,
            "title": result.phase.title,
            "expect": result.phase.expect,
            "seconds": round(result.ended - result.started, 1),
            "pools": pools,
            **_latencies(result.load, result.engine_itl_p99, ttft_slo, tpot_slo),
        }
        if "engine" in gpus:
            phase["colocated"] = _latencies(
                result.colocated_load, result.colocated_engine_itl_p99, ttft_slo, tpot_slo
            )
        phases.append(phase)
    summary: dict[str, Any] = {
        "slo": {"ttft_p99_seconds": ttft_slo, "tpot_p99_seconds": tpot_slo},
        "gpu_minutes": round(gpu_seconds / 60, 2),
        "scaling_actions": actions,
        "failed_requests": sum(p["failed_requests"] for p in phases),
        "phases": phases,
    }
    contrast = _contrast(phases)
    if contrast is not None:
        summary["colocated"] = {
            "gpu_minutes": round(colocated_gpu_seconds / 60, 2),
            "failed_requests": sum(p["colocated"]["failed_requests"] for p in phases),
        }
        summary["contrast"] = contrast
    return summary


def _pool(phase: dict[str, Any], role: str) -> str:
    x = phase["pools"][role]
    return f"{x['start']}->{x['highest']}->{x['end']}"


def show_seconds(value: float | None) -> str:
    """``1.25s``, or ``-`` when there is no value."""
    return "-" if value is None else f"{value:.2f}s"


def show_millis(value: float | None) -> str:
    """``32ms``, or ``-`` when there is no value."""
    return "-" if value is None else f"{value * 1000:.0f}ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def table(summary: dict[str, Any]) -> str:
    """The summary as a fixed-width table."""
    slo = summary["slo"]
    lines = [
        f"SLOs: TTFT p99 {slo['ttft_p99_seconds']:g}s, "
        f"TPOT p99 {slo['tpot_p99_seconds'] * 1000:g}ms. TTFT and TPOT (each request's mean "
        "time per token) at the load generator; ITL, every gap between two tokens, as the "
        "engines timed it",
        f"{'phase':<13} {'prefill':>14} {'decode':>14} {'TTFT p99':>9} {'TPOT p99':>9} "
        f"{'ITL p99':>8} {'TTFT ok':>8} {'TPOT ok':>8} {'failed':>7}",
    ]
    for p in summary["phases"]:
        lines.append(
            f"{p['phase']:<13} {_pool(p, 'prefill'):>14} {_pool(p, 'decode'):>14} "
            f"{show_seconds(p['ttft_p99_seconds']):>9} {show_millis(p['tpot_p99_seconds']):>9} "
            f"{show_millis(p['itl_p99_seconds']):>8} "
            f"{_pct(p['ttft_attainment']):>8} {_pct(p['tpot_attainment']):>8} "
            f"{p['failed_requests']:>7}"
        )
    lines.append(
        f"GPU-minutes {summary['gpu_minutes']:.2f}, scaling actions {summary['scaling_actions']}, "
        f"failed requests {summary['failed_requests']}"
    )
    if "contrast" in summary:
        lines += ["", "The same traffic on a colocated model of the same engines (one pool):"]
        lines.append(
            f"{'phase':<13} {'engine':>14} {'TTFT p99':>9} {'TPOT p99':>9} "
            f"{'ITL p99':>8} {'TTFT ok':>8} {'TPOT ok':>8} {'failed':>7}"
        )
        for p in summary["phases"]:
            c = p["colocated"]
            lines.append(
                f"{p['phase']:<13} {_pool(p, 'engine'):>14} "
                f"{show_seconds(c['ttft_p99_seconds']):>9} "
                f"{show_millis(c['tpot_p99_seconds']):>9} {show_millis(c['itl_p99_seconds']):>8} "
                f"{_pct(c['ttft_attainment']):>8} "
                f"{_pct(c['tpot_attainment']):>8} {c['failed_requests']:>7}"
            )
        colocated = summary["colocated"]
        lines.append(
            f"GPU-minutes {colocated['gpu_minutes']:.2f}, "
            f"failed requests {colocated['failed_requests']}"
        )
        lines.append("")
        for model, seen in summary["contrast"].items():
            ratio = seen["wave_over_chat"]
            lines.append(
                f"Inter-token latency p99 in the wave of long prompts, {model}: "
                f"{show_millis(seen['wave_itl_p99_seconds'])} against "
                f"{show_millis(seen['chat_itl_p99_seconds'])} in steady chat"
                + ("" if ratio is None else f" ({ratio:g}x)")
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
    contrast = any(s.colocated_tpot_p99 is not None for s in samples)
    roles = [("prefill", "tab:orange"), ("decode", "tab:blue")]
    if samples and "engine" in samples[0].replicas:
        roles.append(("engine", "tab:red"))
    for role, color in roles:
        ax_r.step(
            t,
            [s.replicas[role] for s in samples],
            where="post",
            label=f"{role} replicas" + (" (colocated model)" if role == "engine" else ""),
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
    if contrast:
        ax_p.plot(
            t,
            [
                s.colocated_tpot_p99 * 1000 if s.colocated_tpot_p99 is not None else float("nan")
                for s in samples
            ],
            color="tab:red",
            label="TPOT p99 (colocated engine pool)",
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
    fig.suptitle(
        "disagg-operator demo: each pool scales on its own SLO"
        + ("; a colocated model of the same engines beside it" if contrast else "")
    )
    fig.tight_layout()
    png_path = out / "timeline.png"
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path
