"""The autoscaler's memory as the model's status keeps it, and back (pure).

A restarted operator, or a new leader, that started from an empty :class:`PoolMemory` lost
the look-back learned from a burst (and shrank before the burst came back), the recent
recommendations the look-back reads, the arrivals a surge is read against and the speeds
and knee learned from what the pools served. ``bench/operator_restart.py`` measures that:
one restart ten minutes in cost six flaps over the 64 rows. So each evaluation's memory goes
into status (:class:`AutoscalerMemory`): what was learned as typed fields a user can read,
the rest as compact JSON with times relative to ``savedAt``.

Everything read back is checked: a history that does not parse, a sample that is not a
number, a count that is not whole, is reported by field and index and that pool starts
afresh (as it did before there was a memory to restore). Samples from after ``now`` (a
clock that differs between the old operator's node and this one's) are dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from pydantic import ValidationError

from disagg.api.resource import format_validation_error
from disagg.api.spec import Mode
from disagg.api.status import (
    MEMORY_HISTORY_MAX_LENGTH,
    AutoscalerMemory,
    LearnedCapacity,
    PoolMemoryStatus,
)
from disagg.autoscale.memory import DEFAULT_PROVISIONING, PoolMemory
from disagg.autoscale.model import PoolName
from disagg.clock import epoch_of, rfc3339

SERIES: Final[Mapping[str, tuple[str, ...]]] = {
    "recommendations": ("time", "count", "count"),
    "demand": ("time", "number"),
    "queues": ("time", "number", "number?"),
    "lifetimes": ("time", "number", "number"),
    "steps": ("time", "number", "number"),
    "outputs": ("time", "number"),
    "arrivals": ("time", "number"),
    "orders": ("time", "count"),
    "ledger": ("time", "number", "number", "number"),
}
"""Each list of samples kept in the history, and what each position of a sample holds."""
TIMES: Final = (
    "starting_since", "ready_at", "learned_at", "last_down", "last_up", "idle_since", "counted_at",
)  # fmt: skip
NUMBERS: Final = ("queue_change", "window_queue_change", "window_held_change")
LEARNED: Final[Mapping[str, str]] = {
    "prefill_speed": "prefill_tokens_per_second",
    "batched_speed": "batched_tokens_per_second",
    "batched_prompt": "batched_prompt_tokens",
    "batch": "sequences_per_replica",
    "provisioning": "provisioning_seconds",
    "down_window": "look_back_seconds",
}
"""PoolMemory's learned fields and their names in status."""
MEMORY_REFRESH_SECONDS: Final = 300.0
"""What status holds of an idle model's history is at most this old: a restart then misses
at most five minutes of a pool that served nothing."""


def _number(value: float) -> float | int:
    """Whole numbers without their ".0", the rest to the last digit: a restored memory
    decides exactly as the saved one would have."""
    return int(value) if value == int(value) and abs(value) < 2**53 else float(value)


def _time(value: float, base: int) -> float | int:
    return _number(round(value - base, 3))


def _finite(sample: tuple[Any, ...]) -> bool:
    return all(v is None or math.isfinite(v) for v in sample)


def _learned(name: str, value: float | None) -> float | None:
    """A learned value as status may hold it (the API's bounds), else None: never refuse a
    status write over a value the policy itself tolerates."""
    if value is None or not math.isfinite(value):
        return None
    if name == "down_window":
        return float(value) if value >= 0 else None
    return float(value) if value > 0 else None


def remembered(memories: Mapping[PoolName, PoolMemory], mode: Mode, now: float) -> AutoscalerMemory:
    """What status keeps of the pools' memories at ``now``."""
    base = int(now)
    pools: dict[str, PoolMemoryStatus] = {}
    for pool, memory in memories.items():
        history: dict[str, Any] = {}
        for name, kinds in SERIES.items():
            history[name] = [
                [
                    None
                    if value is None
                    else _time(value, base)
                    if kind == "time"
                    else _number(value)
                    for kind, value in zip(kinds, sample, strict=True)
                ]
                for sample in getattr(memory, name)
                if _finite(sample)
            ]
        for name in TIMES:
            value = getattr(memory, name)
            finite = value is not None and math.isfinite(value)
            history[name] = _time(value, base) if finite else None
        for name in NUMBERS:
            value = getattr(memory, name)
            history[name] = _number(value) if math.isfinite(value) else 0
        history["ready_count"] = memory.ready_count
        history["wanted_count"] = memory.wanted_count
        text = json.dumps(history, separators=(",", ":"))
        while len(text) > MEMORY_HISTORY_MAX_LENGTH:
            # An interval of a second under an hour's look-back: keep the newest half.
            for name in SERIES:
                del history[name][: len(history[name]) // 2 or len(history[name])]
            text = json.dumps(history, separators=(",", ":"))
        learned = {
            status: _learned(name, getattr(memory, name)) for name, status in LEARNED.items()
        }
        learned["provisioning_seconds"] = learned["provisioning_seconds"] or DEFAULT_PROVISIONING
        learned["look_back_seconds"] = learned["look_back_seconds"] or 0.0
        pools[pool] = PoolMemoryStatus(
            learned=LearnedCapacity.model_validate(learned), shape=memory.shape, history=text
        )
    return AutoscalerMemory(mode=mode, saved_at=rfc3339(base), **pools)


class Unreadable(ValueError):
    """A saved memory that cannot be restored; the message names the field."""


def _sample(
    name: str, index: int, raw: object, kinds: tuple[str, ...], base: float
) -> tuple[Any, ...]:
    where = f"history.{name}[{index}]"
    if not isinstance(raw, list) or len(raw) != len(kinds):
        raise Unreadable(f"{where}: expected {len(kinds)} values, got {raw!r}")
    values: list[Any] = []
    for kind, value in zip(kinds, raw, strict=True):
        if value is None and kind.endswith("?"):
            values.append(None)
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise Unreadable(f"{where}: {value!r} is not a finite number")
        if kind == "count":
            if value != int(value) or value < 0:
                raise Unreadable(f"{where}: {value!r} is not a replica count")
            values.append(int(value))
        else:
            values.append(base + value if kind == "time" else float(value))
    return tuple(values)


def _restore(saved: PoolMemoryStatus, base: float, now: float) -> PoolMemory:
    try:
        history = json.loads(saved.history)
    except json.JSONDecodeError as error:
        raise Unreadable(f"history: not JSON ({error.msg} at character {error.pos})") from error
    if not isinstance(history, dict):
        raise Unreadable("history: expected a JSON object")
    known = {f.name for f in fields(PoolMemory)}
    unknown = sorted(set(history) - known)
    if unknown:
        raise Unreadable(f"history: unknown field(s) {', '.join(unknown)}")
    memory = PoolMemory()
    for name, kinds in SERIES.items():
        raw = history.get(name, [])
        if not isinstance(raw, list):
            raise Unreadable(f"history.{name}: expected a list")
        samples = [_sample(name, i, sample, kinds, base) for i, sample in enumerate(raw)]
        setattr(memory, name, [s for s in samples if s[0] <= now])
    for name in TIMES:
        value = history.get(name)
        if value is not None:
            (at,) = _sample(name, 0, [value], ("time",), base)
            setattr(memory, name, at if at <= now else None)
    for name in NUMBERS:
        (number,) = _sample(name, 0, [history.get(name, 0)], ("number",), base)
        setattr(memory, name, number)
    for name in ("ready_count", "wanted_count"):
        count = history.get(name)
        if count is not None:
            setattr(memory, name, _sample(name, 0, [count], ("count",), base)[0])
    memory.shape = saved.shape
    learned = saved.learned
    for name, status_name in LEARNED.items():
        value = getattr(learned, status_name)
        if value is not None:
            setattr(memory, name, value)
    return memory


@dataclass(frozen=True)
class Recalled:
    """What a restarted autoscaler starts from."""

    memories: dict[PoolName, PoolMemory]
    """Each pool's memory: restored, or empty where nothing could be."""
    problems: list[str] = field(default_factory=list)
    """What could not be read, each naming where."""
    kept: AutoscalerMemory | None = None
    """What status holds, when all of it was restored (status stays as it is until the next
    evaluation)."""


def recalled(saved: object, mode: Mode, pools: tuple[PoolName, ...], now: float) -> Recalled:
    """The pools' memories from what status kept (``saved``: its ``autoscalerMemory``). A pool
    with nothing readable starts afresh; so does every pool when the memory describes another
    mode's pools."""
    fresh = {pool: PoolMemory() for pool in pools}
    if saved is None:
        return Recalled(fresh)
    try:
        memory = AutoscalerMemory.model_validate(saved)
    except ValidationError as error:
        return Recalled(fresh, format_validation_error(error, "status.autoscalerMemory"))
    if memory.mode != mode:
        return Recalled(fresh)
    base = epoch_of(memory.saved_at)
    if base is None:
        return Recalled(
            fresh, [f"status.autoscalerMemory.savedAt: {memory.saved_at!r} is not a time"]
        )
    problems: list[str] = []
    for pool in pools:
        kept = getattr(memory, pool)
        if kept is None:
            continue
        try:
            fresh[pool] = _restore(kept, base, now)
        except Unreadable as error:
            problems.append(f"status.autoscalerMemory.{pool}.{error}")
    return Recalled(fresh, problems, None if problems else memory)


def worth_saving(patch: object, age: float | None) -> bool:
    """Whether a status patch's ``autoscalerMemory`` part is worth a write of its own: what
    was learned changed, the memory appeared, went or describes other pools; or what status
    holds is MEMORY_REFRESH_SECONDS old (``age``, None when unknown). Recent history alone
    waits for a write that carries other news (a pool serving traffic has new metrics every
    evaluation), so an idle model costs one write per MEMORY_REFRESH_SECONDS, not one per
    evaluation."""
    if not isinstance(patch, dict) or patch.keys() - {"savedAt", "prefill", "decode"}:
        return True
    if any(p is None or (isinstance(p, dict) and set(p) != {"history"}) for p in
           (patch[pool] for pool in ("prefill", "decode") if pool in patch)):  # fmt: skip
        return True
    return age is None or age >= MEMORY_REFRESH_SECONDS
