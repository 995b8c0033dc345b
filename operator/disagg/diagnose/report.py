"""The diagnosis as JSON (for automation) and as text (for a terminal), from the same dict."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Final

from disagg.diagnose.advice import NextStep, Traffic
from disagg.diagnose.series import Step, Timeline
from disagg.diagnose.verdict import Finding
from disagg.slo import Slo

SHOWN_SPIKES: Final = 12
"""Correlated windows the text report lists (JSON carries all)."""


def _step(step: Step) -> dict[str, Any]:
    row = asdict(step)
    row["at"] = datetime.fromtimestamp(step.at, UTC).isoformat(timespec="seconds")
    row["meanPrompt"] = step.mean_prompt
    return {_camel(k): v for k, v in row.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def to_json(
    context: dict[str, Any], line: Timeline | None, finding: Finding, slo: Slo,
    traffic: Traffic, advice: NextStep,
) -> dict[str, Any]:  # fmt: skip
    """Everything the diagnosis found, JSON-ready."""
    report: dict[str, Any] = dict(context)
    report.update(
        mode=line.mode if line else None,
        pools=list(line.roles) if line else [],
        decodingPool=line.decoding_role if line else None,
        promptPool=line.prompt_role if line else None,
        slo={"ttftSeconds": slo.ttft, "tpotSeconds": slo.tpot},
        verdict=finding.verdict,
        summary=finding.summary,
        evidence=list(finding.evidence),
        numbers=finding.numbers,
        spikes=[_step(s) for s in finding.spikes],
        traffic={_camel(k): v for k, v in asdict(traffic).items()},
        nextStep={
            "action": advice.action,
            "text": advice.text,
            "maxNumBatchedTokens": advice.budget.tokens if advice.budget else None,
            "mixedStepSeconds": advice.budget.mixed_step if advice.budget else None,
            "longPromptTtftSeconds": advice.budget.long_prompt_ttft if advice.budget else None,
            "command": advice.command,
        },
    )
    return report


def _number(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _latency(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def to_text(report: dict[str, Any]) -> str:
    """The report for a terminal."""
    mode = report["mode"] or "no decoding pool found"
    pools = ", ".join(report["pools"]) or "none"
    lines = [
        f"disagg diagnose {report['namespace']}/{report['model']}: {mode} (pools: {pools}), "
        f"{report['start']} to {report['end']}, step {report['stepSeconds']:g}s",
        "",
        f"verdict: {report['verdict']}",
        f"  {report['summary']}",
    ]
    if report["evidence"]:
        lines += ["", "evidence:"] + [f"  - {line}" for line in report["evidence"]]
    traffic = report["traffic"]
    if any(v is not None for v in traffic.values()):
        lines += [
            "",
            f"traffic: {_number(traffic['rate'], ' req/s', 2)}; prompts mean "
            f"{_number(traffic['meanPrompt'])} tokens (p50 {_number(traffic['p50Prompt'])}, "
            f"p90 {_number(traffic['p90Prompt'])}, p99 {_number(traffic['p99Prompt'])}); "
            f"outputs mean {_number(traffic['meanOutput'])} tokens",
        ]
    spikes = report["spikes"]
    if spikes:
        title = "steps where TPOT p99 spiked" + (
            f" (first {SHOWN_SPIKES} of {len(spikes)})" if len(spikes) > SHOWN_SPIKES else ""
        )
        lines += ["", title + ":"]
        lines.append(
            f"  {'time (UTC)':<10} {'TPOT p99':>9} {'TTFT p99':>9} {'prompt tok/s':>13} "
            f"{'mean prompt':>12} {'waiting':>8} {'running':>8}"
        )
        for s in spikes[:SHOWN_SPIKES]:
            lines.append(
                f"  {s['at'][11:19]:<10} {_latency(s['tpotP99']):>9} {_latency(s['ttftP99']):>9} "
                f"{_number(s['promptTokens']):>13} {_number(s['meanPrompt']):>12} "
                f"{_number(s['waiting']):>8} {_number(s['running']):>8}"
            )
    advice = report["nextStep"]
    lines += ["", f"next step ({advice['action']}): {advice['text']}"]
    if advice["command"] and advice["command"] not in advice["text"]:
        lines.append(f"  or plan a split: {advice['command']}")
    return "\n".join(lines)
