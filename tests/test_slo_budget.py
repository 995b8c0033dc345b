"""Each SLO's error budget over its compliance window: what the engines' histograms say
missed, the ledger status keeps across the window, and what a user sees of it (status, the
Budget column, one Warning when a burn starts)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from disagg.api.base import parse_duration
from disagg.autoscale.budget import (
    FINE_SPAN,
    coarse_slot,
    counted,
    missed_share,
    recorded,
    standing,
)
from disagg.autoscale.policy import Signals
from disagg.cli import main
from test_reconcile_memory import restart
from test_reconcile_pass import NAME, NS, World, autoscaled

INF = math.inf


@pytest.mark.parametrize(
    ("buckets", "slo", "shares"),
    [
        # The SLO on a bound: exact (also as Prometheus spells the bound back).
        (((0.5, 90.0), (1.0, 98.0), (2.5, 100.0), (INF, 100.0)), 1.0, (0.02, 0.02)),
        (((0.05, 99.0), (INF, 100.0)), 0.05000000000000001, (0.01, 0.01)),
        # Inside a bucket: its 8 may have missed or not; 2 surely did.
        (((0.5, 90.0), (1.0, 98.0), (INF, 100.0)), 0.75, (0.02, 0.10)),
        # Beyond the last bound: what the +Inf bucket holds may have missed.
        (((0.5, 90.0), (1.0, 97.0), (INF, 100.0)), 5.0, (0.0, 0.03)),
        # Everything within.
        (((0.025, 40.0), (0.05, 40.0), (INF, 40.0)), 0.05, (0.0, 0.0)),
    ],
)
def test_what_a_histogram_says_for_certain_of_the_share_over_the_slo(
    buckets: tuple[tuple[float, float], ...], slo: float, shares: tuple[float, float]
) -> None:
    assert missed_share(buckets, slo) == pytest.approx(shares)


def test_nothing_observed_is_no_share_and_the_first_evaluation_counts_nothing() -> None:
    assert missed_share((), 1.0) is None
    assert missed_share(((1.0, 0.0), (INF, 0.0)), 1.0) is None
    rates = ((1.0, 9.0), (INF, 10.0))
    # The first evaluation's rates cover requests from before anyone counted.
    assert counted(rates, 1.0, None, 120.0) == (0.0, 0.0, 0.0)
    assert counted(rates, 1.0, 15.0, 120.0) == pytest.approx((150.0, 15.0, 15.0))
    # After an outage the rates describe only the query window's requests.
    assert counted(rates, 1.0, 900.0, 120.0) == pytest.approx((1200.0, 120.0, 120.0))


def test_a_day_in_the_ledger_keeps_every_request_in_a_few_hundred_slots() -> None:
    window = 86400.0
    ledger: list[tuple[float, float, float, float]] = []
    now = 1_000_000.0
    for tick in range(1, 2 * 86400 // 15 + 1):  # two days at a 15 s interval
        t = now + 15 * tick
        # 10 requests/s; the second day misses 0.5% of them, the last half hour 20%.
        share = 0.2 if t > now + 2 * 86400 - 1800 else 0.005 if t > now + 86400 else 0.0
        # Another 1% of them in the bucket that holds the SLO: they may have missed it.
        ledger = recorded(ledger, t, (150.0, 150.0 * share, 150.0 * (share + 0.01)), window)
    end = now + 2 * 86400
    assert len(ledger) <= 60 + window / coarse_slot(window) + 2
    # The first day left the window; the second day is all there, within a slot's width.
    budget = standing(ledger, end, window)
    assert budget.requests == pytest.approx(864_000, rel=coarse_slot(window) / window)
    expected_missed = 0.005 * 150 * (86400 - 1800) / 15 + 0.2 * 150 * 1800 / 15
    assert budget.missed == pytest.approx(expected_missed, rel=0.01)
    # 1% of 864k requests may miss; 4,212 + 36,000 did: four times the budget is spent.
    assert budget.remaining == pytest.approx(1 - expected_missed / 8640, rel=0.01)
    assert budget.missed_at_most == pytest.approx(expected_missed + 8640, rel=0.01)
    assert budget.remaining_at_least == pytest.approx(budget.remaining - 1, rel=0.01)
    # The last half hour burns at 20x, the hour before it at 0.5x.
    assert budget.burn_short == pytest.approx(20.0)
    assert budget.burn_long == pytest.approx(10.25, rel=0.05)
    assert budget.fast_burn_at == 1.0 and budget.fast_burn  # a day's 2% in an hour: 0.48x
    # Slots newer than an hour are minutes; older ones are merged, not lost.
    assert all(b - a == 60 for (a, *_), (b, *_) in zip(ledger[-59:], ledger[-58:], strict=False))
    assert ledger[-61][0] < end - FINE_SPAN


def test_the_default_window_is_28_days_and_its_fast_burn_the_workbooks_page() -> None:
    budget = standing([(0.0, 1000.0, 200.0, 200.0)], 60.0, parse_duration("672h"))
    assert budget.fast_burn_at == pytest.approx(13.44)  # 2% of 672 hours' budget in one
    assert budget.burn_short == pytest.approx(20.0) and budget.fast_burn
    assert budget.remaining == pytest.approx(-19.0)


def _histogram(rate: float, missed: float, slo: float) -> tuple[tuple[float, float], ...]:
    """Bucket rates with ``missed`` of ``rate`` over ``slo``, which is a bucket bound."""
    return ((slo / 2, rate * (1 - missed) / 2), (slo, rate * (1 - missed)), (INF, rate))


async def _serving_prefill(missed: float) -> World:
    """A model (TTFT 1 s, TPOT 50 ms) with its pools up, whose prefill engines serve 4
    requests/s with ``missed`` of them over the TTFT SLO."""
    world = World(autoscaled())
    await world.reconcile()
    world.pools_ready()
    world.prometheus.prefill = Signals(
        p99=1.2, request_rate=4.0, queue=0.0, running=2.0, pods_reporting=10,
        slo_buckets=_histogram(4.0, missed, 1.0),
    )  # fmt: skip
    return world


async def test_status_shows_each_slos_budget_and_a_fast_burn_warns_once() -> None:
    world = await _serving_prefill(missed=0.05)
    # Every stream within TPOT.
    world.prometheus.decode = Signals(
        p99=0.02, request_rate=4.0, queue=0.0, running=8.0, kv_usage=0.2, pods_reporting=10,
        slo_buckets=_histogram(4.0, 0.0, 0.05),
    )  # fmt: skip
    for _ in range(21):  # five minutes of evaluations, 15 s apart
        world.clock.now += 15
        await world.reconcile()
        world.pools_ready()
    status = world.model()["status"]["sloBudget"]
    ttft, tpot = status["ttft"], status["tpot"]
    assert status["window"] == "672h"
    # 20 intervals counted (the first evaluation's rates are not apart from it).
    assert (ttft["requests"], ttft["missed"]) == (1200, 60)
    assert ttft["attainment"] == "95.00%" and ttft["remaining"] == "-400%"
    assert ttft["burnRate5m"] == pytest.approx(5.0) and not ttft["fastBurn"]
    assert (tpot["requests"], tpot["missed"], tpot["remaining"]) == (1200, 0, "100%")
    assert status["summary"] == "-400% (TTFT)"

    # Now a third of the prompts miss: 33x, past the 28-day window's 13.44x page.
    world.prometheus.prefill = Signals(
        p99=3.0, request_rate=4.0, queue=0.0, running=2.0, pods_reporting=10,
        slo_buckets=_histogram(4.0, 1 / 3, 1.0),
    )  # fmt: skip
    for _ in range(60):
        world.clock.now += 15
        await world.reconcile()
        world.pools_ready()
    ttft = world.model()["status"]["sloBudget"]["ttft"]
    assert ttft["fastBurn"] and ttft["burnRate5m"] == pytest.approx(100 / 3, rel=0.01)
    warnings = world.events("SLOBudgetFastBurn")
    assert len(warnings) == 1, warnings
    assert warnings[0]["type"] == "Warning" and "TTFT p99 SLO" in warnings[0]["message"]

    # A restarted operator counts on from what status kept.
    before = ttft["requests"]
    restart(world)
    world.clock.now += 15
    await world.reconcile()
    after = world.model()["status"]["sloBudget"]["ttft"]
    assert after["requests"] == before + 60
    assert len(world.events("SLOBudgetFastBurn")) == 1  # the same burn: no second Warning


async def test_without_the_builtin_autoscaler_no_budget_is_shown() -> None:
    world = World(autoscaled())
    await world.reconcile()
    world.pools_ready()
    world.clock.now += 15
    await world.reconcile()
    assert "sloBudget" in world.model()["status"]
    world.edit({"autoscaling": {"enabled": False}})
    world.clock.now += 15
    await world.reconcile()
    assert "sloBudget" not in world.model()["status"]


def test_a_window_outside_1h_to_90_days_is_refused_with_where() -> None:
    from pydantic import ValidationError

    from disagg.api.autoscaling import AutoscalingSpec

    for window in ("30m", "2161h"):
        with pytest.raises(ValidationError, match=r"sloWindow must be from 1h to 2160h"):
            AutoscalingSpec.model_validate({"sloWindow": window})
    with pytest.raises(ValidationError, match="not a duration"):
        AutoscalingSpec.model_validate({"sloWindow": "28d"})


@pytest.mark.parametrize("tpot", ["0.012", "0.025"])
def test_the_simulated_operators_count_brackets_what_the_requests_saw(
    tpot: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A colocated pool observes each request's whole TTFT and TPOT, as the client sees them.
    # 25 ms is one of vLLM's bucket bounds, 12 ms is not: the count is exact, or a range.
    args = ["simulate", "--workload", "chat", "--rate", "8", "--duration", "600", "--seed", "7",
            "--mode", "colocated", "--ttft", "0.5", "--tpot", tpot, "--json"]  # fmt: skip
    assert main(args) == 0
    values = json.loads(capsys.readouterr().out)
    exact, counted = values["attainment"], values["budgetAsCounted"]
    for slo in ("ttft", "tpot"):
        seen = counted[slo]
        # Rates read over a window: the first minute's are read over less and count a
        # little more, the last minute's a little less.
        assert seen["requests"] == pytest.approx(values["requests"], rel=0.05), seen
        assert seen["attainmentAtLeast"] - 0.005 <= exact[slo] <= seen["attainment"] + 0.005
    ranged = counted["tpot"]["attainmentAtLeast"] < counted["tpot"]["attainment"]
    assert ranged == (tpot == "0.012"), counted


def test_status_shows_a_range_where_the_histogram_cannot_tell() -> None:
    from disagg.reconcile.evaluate import budget_status

    # 1,000 requests: TTFT 5 surely missed, TPOT none surely but 40 in the SLO's bucket.
    ttft = standing([(0.0, 1000.0, 5.0, 5.0)], 60.0, 86400.0)
    tpot = standing([(0.0, 1000.0, 0.0, 40.0)], 60.0, 86400.0)
    shown = budget_status({"prefill": ttft, "decode": tpot}, "24h")
    assert shown is not None and shown.ttft is not None and shown.tpot is not None
    assert (shown.ttft.attainment, shown.ttft.remaining) == ("99.50%", "50%")
    assert (shown.tpot.attainment, shown.tpot.remaining) == ("96.00..100.00%", "-300..100%")
    assert (shown.tpot.missed, shown.tpot.missed_at_most) == (0, 40)
    # The column names the SLO whose budget may be the lowest, with its range.
    assert shown.summary == "-300..100% (TPOT)"
    # Burn rates read only what surely missed: no page on requests that may have met it.
    assert tpot.burn_short == 0.0 and not tpot.fast_burn


async def test_the_operators_metrics_count_each_slos_requests_and_misses() -> None:
    from prometheus_client import generate_latest

    from disagg.reconcile.metrics import OperatorMetrics

    world = await _serving_prefill(missed=0.05)
    metrics = OperatorMetrics()
    for _ in range(3):
        world.clock.now += 15
        outcome = await world.reconcile()
        assert outcome.budgeted and outcome.slo is not None
        metrics.observe_slo(NS, NAME, outcome.slo)
    text = generate_latest(metrics.registry).decode()
    labels = f'model="{NAME}",model_namespace="{NS}",slo="ttft"'
    # Two intervals counted (the first evaluation's rates overlap what came before).
    assert f"disagg_slo_requests_total{{{labels}}} 120.0" in text
    assert f"disagg_slo_missed_total{{{labels}}} 6.0" in text
    assert f"disagg_slo_budget_remaining{{{labels}}} -4.0" in text
    assert f'disagg_slo_window_seconds{{model="{NAME}",model_namespace="{NS}"}} 2.4192e+06' in text
    assert (
        f'disagg_autoscaler_metrics_unavailable{{model="{NAME}",model_namespace="{NS}"}} 0.0'
        in text
    )
    # What the dashboards and the at-maximum alert read: the SLOs, and each pool's size.
    assert f"disagg_slo_target_seconds{{{labels}}} 1.0" in text
    assert (
        f'disagg_slo_target_seconds{{model="{NAME}",model_namespace="{NS}",slo="tpot"}} 0.05'
        in text
    )
    pool = f'model="{NAME}",model_namespace="{NS}",pool="prefill"'
    # Over its SLO (1.2 s against 1 s), the prefill pool was ordered a second replica that
    # is not ready yet: the dashboards draw both, and the scale-up as an annotation.
    assert f'disagg_pool_replicas{{{pool},state="desired"}} 2.0' in text
    assert f'disagg_pool_replicas{{{pool},state="ready"}} 1.0' in text
    assert f'disagg_pool_replica_bounds{{bound="max",{pool}}} 8.0' in text
    assert f"disagg_pool_slo_pressure{{{pool}}} 1.2" in text
    assert f'disagg_autoscaler_scalings_total{{direction="up",{pool}}} 1.0' in text

    world.prometheus.down = True
    world.clock.now += 15
    outcome = await world.reconcile()
    assert outcome.slo is not None and outcome.slo.holding
    metrics.observe_slo(NS, NAME, outcome.slo)
    text = generate_latest(metrics.registry).decode()
    assert (
        f'disagg_autoscaler_metrics_unavailable{{model="{NAME}",model_namespace="{NS}"}} 1.0'
        in text
    )

    metrics.forget_slo(NS, NAME)  # the model is gone, or no longer autoscaled
    assert f'model="{NAME}"' not in generate_latest(metrics.registry).decode()


async def test_a_models_slo_series_go_when_it_does_and_stay_through_a_refused_apply() -> None:
    from types import SimpleNamespace

    from prometheus_client import generate_latest

    from disagg.reconcile.evaluate import SloReport
    from disagg.reconcile.handlers import _work
    from disagg.reconcile.metrics import OperatorMetrics
    from disagg.reconcile.model import Outcome

    metrics = OperatorMetrics()
    outcomes: list[Outcome] = []

    async def synced() -> None:
        return None

    async def reconcile(namespace: str, name: str) -> Outcome:
        return outcomes.pop(0)

    runtime: Any = SimpleNamespace(
        cache=SimpleNamespace(synced=synced), metrics=metrics, queue=None, leading=True,
        reconciler=SimpleNamespace(reconcile=reconcile),
    )  # fmt: skip
    report = SloReport(672 * 3600.0, {"ttft": (10.0, 1.0, 1.0)}, {"ttft": 0.0}, holding=False)

    def exported() -> bool:
        return f'model="{NAME}"' in generate_latest(metrics.registry).decode()

    for outcome, kept in [
        (Outcome(budgeted=True, slo=report), True),
        (Outcome(budgeted=True), True),  # no evaluation due this pass
        (Outcome(), True),  # an apply the API server refused: the model is still there
        (Outcome(budgeted=False), False),  # autoscaling turned off
        (Outcome(budgeted=True, slo=report), True),
        (Outcome(gone=True), False),  # deleted
    ]:
        outcomes.append(outcome)
        await _work(runtime, (NS, NAME))
        assert exported() == kept, outcome
