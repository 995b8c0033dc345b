"""Where a pool's demand is heading (pure): least-squares lines through its recent samples.

The headroom (:func:`disagg.autoscale.sizing.headroom`) provisions for where the demand's
rise leads one provisioning delay ahead: a rise seen over both of the last two delays, only
as far as it lies beyond the samples' own noise. The decode step line
(:func:`disagg.autoscale.sizing.step_line`) is fitted with the same least squares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

GROWTH_CAP: Final = 2.0
"""Demand one delay ahead is read as at most this many times the demand now."""
TREND_SIGMAS: Final = 2.0
"""A trend extrapolates only the slope beyond this many of its standard errors, as the fit
reads them (readings over a minute every 15 s share three quarters of their requests, so
that error is about half the true one): long prompts at one a second make prompt tokens/s
jump by half within a minute, and a line fitted to that extrapolated noise."""


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least-squares (slope, mean value, mean time) of (time, value) points; None without a
    time spread."""
    fit = _fit(points)
    return None if fit is None else fit[:3]


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float, float, float] | None:
    """fit_line's (slope, mean value, mean time) and the points' squared time spread."""
    n = len(points)
    if n < 2:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_d = sum(d for _, d in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if not spread:
        return None
    return sum((t - mean_t) * (d - mean_d) for t, d in points) / spread, mean_d, mean_t, spread


def _slope_error(
    points: Sequence[tuple[float, float]], fit: tuple[float, float, float, float]
) -> float:
    """The standard error of the slope ``fit`` (from _fit) found in ``points``, from its
    residuals."""
    n = len(points)
    if n < 3:
        return 0.0
    slope, mean_d, mean_t, spread = fit
    residuals = sum((d - mean_d - slope * (t - mean_t)) ** 2 for t, d in points)
    return math.sqrt(residuals / (n - 2) / spread)


def trend(
    demand: Sequence[tuple[float, float]], delay: float, sigmas: float = TREND_SIGMAS
) -> float:
    """The demand one ``delay`` from now over the demand now (1 when flat or falling), at most
    GROWTH_CAP.

    A trend is a rise seen in both of the last two delays: the newer delay's slope is
    extrapolated in the proportion the older one rose as fast (relative to its level). A
    step (flat, then a jump) has no trend: extrapolating the jump would order replicas for a
    rise that already ended, and the load estimate sees the new level anyway. A rise that
    slows (the newer slope under the older, as toward a daily peak) is expected to slow as
    much again over the next delay; a steady ramp keeps its slope. Fitting whole delays, not
    the last few samples, keeps the rate estimate's own noise out of it, and of each slope
    only what lies beyond ``sigmas`` of its standard errors counts (TREND_SIGMAS)."""
    if not demand:
        return 1.0
    now = demand[-1][0]
    # A rise from nothing is traffic starting, not a trend to extrapolate.
    recent = [(t, d) for t, d in demand if now - 2 * delay <= t and d > 0]
    if len(recent) < 4 or now - recent[0][0] < delay:
        return 1.0
    older_points = [(t, d) for t, d in recent if t < now - delay]
    newer_points = [(t, d) for t, d in recent if t >= now - delay]
    older, newer = _fit(older_points), _fit(newer_points)
    if older is None or newer is None:
        return 1.0
    (old_slope, old_mean, _, _), (slope, mean, mean_t, _) = older, newer
    old_slope -= sigmas * _slope_error(older_points, older)
    slope -= sigmas * _slope_error(newer_points, newer)
    if old_slope <= 0 or slope <= 0:
        return 1.0
    sustained = min(1.0, (old_slope / old_mean) / (slope / mean))
    slowing = min(1.0, slope / old_slope)
    level = mean + slope * (now - mean_t)  # the newer line, now
    return max(1.0, min(GROWTH_CAP, 1 + sustained * slowing * slope * delay / level))
