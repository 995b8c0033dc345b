"""`make demo` in its non-interactive mode, with the short story, asserted on its summary:
each pool scales on its own SLO, and beside the split a colocated model of the same engines
shows the interference the split removes (and `disagg diagnose` says so)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import ROOT, Kube


def test_demo_shows_each_pool_scaling_up_and_down(kube: Kube, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "disagg.cli",
            "demo",
            "--non-interactive",
            "--story",
            "short",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    phases = {p["phase"]: p for p in summary["phases"]}
    prompts, outputs, quiet = phases["long-prompts"], phases["long-outputs"], phases["quiet"]
    assert prompts["pools"]["prefill"]["highest"] >= 2, prompts
    assert prompts["pools"]["decode"]["highest"] == prompts["pools"]["decode"]["start"], prompts
    assert outputs["pools"]["decode"]["highest"] >= 2, outputs
    assert outputs["pools"]["prefill"]["highest"] <= outputs["pools"]["prefill"]["start"], outputs
    assert quiet["pools"]["prefill"]["end"] == 1 and quiet["pools"]["decode"]["end"] == 1, quiet
    assert summary["failed_requests"] == 0
    # The contrast: the same wave over the same chat, on a colocated model of the same engines.
    contrast = summary["contrast"]
    assert contrast["colocated"]["wave_over_chat"] >= 3, contrast
    assert contrast["disaggregated"]["wave_over_chat"] <= 1.2, contrast
    assert summary["colocated"]["failed_requests"] == 0
    diagnoses = summary["diagnoses"]
    assert diagnoses["llama-colocated"]["verdict"] == "interference", diagnoses
    assert diagnoses["llama"]["verdict"] == "healthy", diagnoses
    assert "disagg diagnose --model llama-colocated: interference" in result.stdout
    assert summary["scaling_actions"] >= 4 and summary["gpu_minutes"] > 0
    for name in ("timeline.png", "dashboard.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert "long-prompts" in result.stdout and "GPU-minutes" in result.stdout
    assert "[long-prompts]" in result.stdout, "one status line per interval without a TTY"
