"""bench/autoscaler_compare.py on a user's trace: what it prints when requests are refused."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT


def _refused_trace(path: Path) -> int:
    """240 short chat requests over a minute, every 20th with a prompt longer than OPT-13B's
    2048-token context; how many of those."""
    rng = random.Random(5)
    lines, t, too_long = ["arrival,input_tokens,output_tokens"], 0.0, 0
    for i in range(240):
        t += rng.expovariate(4)
        prompt = 3000 if i % 20 == 0 else rng.randint(50, 800)
        too_long += prompt > 2048
        lines.append(f"{t:.3f},{prompt},{rng.randint(5, 60)}")
    path.write_text("\n".join(lines) + "\n")
    return too_long


def _compare(trace: Path, cache: Path, *flags: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "autoscaler_compare.py"), "--trace", str(trace),
         "--model", "opt-13b", "--gpu", "a100", *flags],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "DISAGG_CACHE": str(cache)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def _strict(constant: str) -> Any:
    raise ValueError(f"not JSON: {constant}")


def test_refused_requests_are_counted_and_their_p99s_not_a_made_up_number(
    tmp_path: Path,
) -> None:
    # Over 1% refused makes every policy's p99 infinite. The table printed it as 9999.00s
    # and 99000.0ms, and --json as Infinity, which strict JSON parsers (jq) refuse.
    trace = tmp_path / "refused.csv"
    too_long = _refused_trace(trace)
    report = json.loads(_compare(trace, tmp_path, "--json"), parse_constant=_strict)
    (entry,) = report
    assert entry["refused"] == too_long == 12
    assert entry["ceiling"] <= 1 - too_long / 240
    assert all(row["ttftP99"] is None and row["tpotP99"] is None for row in entry["rows"])

    table = _compare(trace, tmp_path)  # the baselines now come from the cache
    assert "240 requests, 12 refused: longer than the model's context" in table
    assert "9999" not in table and "99000" not in table
    assert "-: over 1% of requests never got a first token or finished" in table
