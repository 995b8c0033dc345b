"""Request streams for the fleet simulator: synthetic workloads, shapes, and trace files (pure).

Synthetic workloads follow the published statistics in ``shared/reference/performance.md``:
chat is the Azure conversation trace (lognormal prompt mu 6.63 sigma 0.99, output mu 5.02
sigma 0.86, Poisson), code is the Azure code trace (prompt 7.00/1.36, output 2.79/0.85,
bursty Gamma inter-arrivals), long-context is Mooncake-like (prompt 8.74/1.20, output
5.34/1.36). Everything is seeded: the same arguments give the same requests.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final


@dataclass(frozen=True)
class Request:
    """One request of a trace: when it arrives and how long it is, in tokens."""

    arrival: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Workload:
    """Length distributions and burstiness of a kind of traffic."""

    prompt_mu: float
    prompt_sigma: float
    prompt_max: int
    output_mu: float
    output_sigma: float
    output_max: int
    burstiness: float = 1.0
    """Coefficient of variation of inter-arrival times (1 = Poisson)."""


WORKLOADS: Final[dict[str, Workload]] = {
    "chat": Workload(6.63, 0.99, 8192, 5.02, 0.86, 1000),
    "code": Workload(7.00, 1.36, 7437, 2.79, 0.85, 512, burstiness=4.0),
    "long-context": Workload(8.74, 1.20, 32768, 5.34, 1.36, 1000),
}

MAX_SPAN_SECONDS: Final = 7 * 86400.0
"""The longest traffic the simulator replays: a week. A trace longer than that is almost
always one whose times are not seconds (epoch milliseconds under ``arrival``), and it would
run for hours, ticking its policy every interval of it."""

RateShape = Callable[[float], float]
"""Multiplier of the base rate at time t (seconds)."""


def steady(_: float) -> float:
    return 1.0


def diurnal(period: float, low: float = 0.3) -> RateShape:
    """A day compressed into ``period`` seconds: from ``low`` to 1 and back."""
    return lambda t: low + (1 - low) * (0.5 - 0.5 * math.cos(2 * math.pi * t / period))


def burst(start: float, length: float, factor: float) -> RateShape:
    """``factor`` times the base rate between ``start`` and ``start + length``."""
    return lambda t: factor if start <= t < start + length else 1.0


def step(at: float, factor: float) -> RateShape:
    """The rate changes by ``factor`` at time ``at`` and stays there."""
    return lambda t: factor if t >= at else 1.0


def _length(rng: random.Random, mu: float, sigma: float, limit: int) -> int:
    return max(1, min(limit, round(rng.lognormvariate(mu, sigma))))


def generate(
    workload: Workload | str,
    rate: float,
    duration: float,
    seed: int = 0,
    shape: RateShape = steady,
    fixed: tuple[int, int] | None = None,
) -> list[Request]:
    """Requests at ``rate`` per second (times ``shape``) for ``duration`` seconds.

    ``fixed`` = (prompt, output) overrides the length distributions (for validation runs).
    """
    spec = WORKLOADS[workload] if isinstance(workload, str) else workload
    if rate <= 0 or duration <= 0:
        return []
    rng = random.Random(seed)
    requests: list[Request] = []
    t = 0.0
    cv = spec.burstiness
    peak = rate * max(shape(x * duration / 200) for x in range(201))
    while True:
        # Gamma inter-arrivals with the workload's CV, thinned to follow the shape.
        gap = rng.gammavariate(1 / cv**2, cv**2 / peak) if cv != 1 else rng.expovariate(peak)
        t += gap
        if t >= duration:
            return requests
        if rng.random() > rate * shape(t) / peak:
            continue
        if fixed is not None:
            prompt, output = fixed
        else:
            prompt = _length(rng, spec.prompt_mu, spec.prompt_sigma, spec.prompt_max)
            output = _length(rng, spec.output_mu, spec.output_sigma, spec.output_max)
        requests.append(Request(t, prompt, output))


def load_trace(path: Path) -> list[Request]:
    """A user's trace: CSV (arrival,input_tokens,output_tokens) or JSONL with those keys, or
    a public trace in its own format, told by its header.

    Arrival is seconds (``arrival`` or ``arrival_s``), or milliseconds under ``timestamp`` as
    in Mooncake's traces (with ``input_length``/``output_length``). Azure's LLM inference
    traces (``TIMESTAMP,ContextTokens,GeneratedTokens``) stamp a date and time (UTC when it
    names no zone); BurstGPT's (``Timestamp``, ``Request tokens``, ``Response tokens``)
    seconds, and it logs failed requests with no response tokens: those are left out.
    Arrivals are rebased so the first request arrives at 0. Raises ValueError naming the
    file and the first bad row (a CSV's rows count from 1 after its header, a JSONL's are
    its lines), or the first and last rows when the arrivals span more than
    MAX_SPAN_SECONDS.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    read = ((_request(path, number, row), number) for number, row in _rows(path, text))
    rows = [(request, number) for request, number in read if request is not None]
    rows.sort(key=lambda pair: pair[0].arrival)
    if not rows:
        return []
    (first, first_row), (last, last_row) = rows[0], rows[-1]
    span = last.arrival - first.arrival
    if span > MAX_SPAN_SECONDS:
        raise ValueError(
            f"{path}: arrivals span {span:.3g}s (row {first_row} at {first.arrival:.15g}s to row "
            f"{last_row} at {last.arrival:.15g}s), longer than the {MAX_SPAN_SECONDS / 86400:g} "
            "days the simulator replays: arrival and arrival_s are seconds, Mooncake's "
            "timestamp milliseconds"
        )
    start = first.arrival
    return [Request(r.arrival - start, r.prompt_tokens, r.output_tokens) for r, _ in rows]


def _rows(path: Path, text: str) -> Iterator[tuple[int, object]]:
    if path.suffix != ".jsonl":
        yield from enumerate(csv.DictReader(text.splitlines()), start=1)
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: row {number}: not JSON ({error.msg})") from None


AZURE: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT: Final = ("Timestamp", "Request tokens", "Response tokens")


def _azure_time(stamp: object) -> float:
    """Seconds since the epoch of an Azure trace's ``2023-11-16 18:15:46.6805900``."""
    if not isinstance(stamp, str):
        raise TypeError(f"TIMESTAMP {stamp!r} is not a date and time")
    try:
        at = datetime.fromisoformat(stamp.strip())
    except ValueError:
        raise ValueError(f"TIMESTAMP {stamp!r} is not a date and time") from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _fields(row: dict[str, Any]) -> tuple[float, int, int] | None:
    """(arrival in seconds, prompt tokens, output tokens) of a row in any format read, or
    None for a row the format says to leave out."""
    if AZURE[0] in row:
        return _azure_time(row[AZURE[0]]), int(row[AZURE[1]]), int(row[AZURE[2]])
    if BURSTGPT[0] in row:
        output = int(row[BURSTGPT[2]])
        if output == 0:
            return None  # a failed request, as BurstGPT logs them
        return float(row[BURSTGPT[0]]), int(row[BURSTGPT[1]]), output
    if "timestamp" in row:
        arrival = float(row["timestamp"]) / 1000
    elif "arrival_s" in row:
        arrival = float(row["arrival_s"])
    else:
        arrival = float(row["arrival"])
    prompt = int(row.get("input_tokens") or row["input_length"])
    return arrival, prompt, int(row.get("output_tokens") or row["output_length"])


def _request(path: Path, number: int, row: object) -> Request | None:
    try:
        if not isinstance(row, dict):
            raise TypeError(f"a {type(row).__name__}, not an object")
        fields = _fields(row)
    except (KeyError, ValueError, TypeError, OverflowError) as error:
        raise ValueError(
            f"{path}: row {number}: needs arrival, input_tokens, output_tokens, or Azure's "
            f"{', '.join(AZURE)}, or BurstGPT's {', '.join(BURSTGPT)} ({error})"
        ) from None
    if fields is None:
        return None
    arrival, prompt, output = fields
    if not math.isfinite(arrival) or arrival < 0:
        raise ValueError(f"{path}: row {number}: arrival must be a finite number >= 0")
    if prompt < 1 or output < 1:
        raise ValueError(f"{path}: row {number}: token counts must be >= 1")
    return Request(arrival, prompt, output)
