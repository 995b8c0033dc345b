"""Time as the operator reads and writes it: an injectable clock and RFC 3339 stamps.

Everything that decides on time takes a :data:`Clock` (seconds since the epoch), so tests
drive it; everything that writes a time to the API server writes it through
:func:`rfc3339`, in the seconds-precision form of ``metav1.Time``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

Clock = Callable[[], float]
system_clock: Clock = time.time


def rfc3339(epoch: float) -> str:
    """``2026-12-01T15:26:03Z``: what status times and Events carry."""
    moment = dt.datetime.fromtimestamp(int(epoch), dt.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def parse_time(text: str | None) -> dt.datetime | None:
    """An RFC 3339 time from the API server (``Z`` or an offset, any precision), or None."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None  # a hand-edited status: treat the time as unknown
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def epoch_of(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time, or None."""
    moment = parse_time(text)
    return moment.timestamp() if moment else None
