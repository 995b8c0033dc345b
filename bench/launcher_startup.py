"""What the engine launcher costs at pod start: milliseconds from its exec to the engine's.

The stand-in engine is ``/bin/true``, so each row is the launcher's own start-up (interpreter,
imports, the plan, ``execvpe``) plus a trivial process. Rows: the engine alone; the
``disagg-engine`` console script as the engine images run it; the same with no
site-packages (``python -S``: what it costs with nothing but the standard library); and
``disagg engine launch``, the same command through the whole project's CLI (what the engine
images ran before the launcher had a distribution of its own).

    .venv/bin/python bench/launcher_startup.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _time(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    env = {**os.environ, "DISAGG_TRANSPORT": "tcp", "DISAGG_ROLE": "decode"}
    bare = {**env, "PYTHONPATH": str(ROOT / "engine" / "src")}
    rows = [
        ("engine alone (/bin/true)", ["/bin/true"], env),
        ("disagg-engine launch", [str(BIN / "disagg-engine"), "launch", "--", "/bin/true"], env),
        (
            "python -S -m disagg_engine.cli launch",
            [sys.executable, "-S", "-m", "disagg_engine.cli", "launch", "--", "/bin/true"],
            bare,
        ),
        ("disagg engine launch", [str(BIN / "disagg"), "engine", "launch", "--", "/bin/true"], env),
    ]
    print(f"{'LAUNCH PATH':40} {'P50 MS':>8} {'P90 MS':>8}   ({args.runs} runs each)")
    for name, argv, run_env in rows:
        samples = sorted(_time(argv, run_env, args.runs))
        p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))]
        print(f"{name:40} {statistics.median(samples):8.1f} {p90:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
