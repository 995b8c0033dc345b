"""Closed-loop autoscaling scenarios (time-scaled 10x): each pool scales on its own SLO."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from closedloop import TIME_SCALE, LoadReport, ReplicaRecorder, Stack, drive, stack
from dataplane import LOG_DIR
from disagg import dashboards
from disagg.autoscale.recall import recalled
from disagg.demo.load import MODEL
from disagg.naming import RELEARN_ANNOTATION
from disagg.reconcile.evaluate import DELETION_COST, POOLS
from harness import Kube, Operator, wait_for


@pytest.fixture(scope="module")
def loop(kube: Kube) -> Iterator[Stack]:
    from harness import new_namespace

    namespace = new_namespace(kube)
    with stack(kube, namespace) as s:
        yield s
    kube.run("delete", "namespace", namespace, "--wait=false", check=False)


def wait_for_minimum(loop: Stack, what: str = "both pools at their minimum") -> None:
    wait_for(what, lambda: loop.replicas() == {"prefill": 1, "decode": 1}, timeout=150, interval=1)


def test_long_prompts_scale_prefill_while_decode_stays(loop: Stack) -> None:
    assert loop.replicas() == {"prefill": 1, "decode": 1}
    with ReplicaRecorder(loop) as timeline:
        # 12k-token prompts (~0.5 s of prefill each on one H100) at 3 req/s overload one engine.
        report = asyncio.run(
            drive(loop.router.url, rate=3, seconds=40, prompt_tokens=12_000, max_tokens=8)
        )
    assert report.failed == 0, report.errors[:5]
    status = loop.model()["status"]
    assert timeline.highest("prefill") >= 2, (
        status["conditions"],
        status["metrics"],
        status["prefill"],
    )
    assert timeline.highest("decode") == 1, (timeline.samples, status["decode"])
    model = loop.model()
    assert "scale up" in (model["status"]["prefill"].get("lastScaleReason") or "")
    assert loop.condition("ScalingActive")["status"] == "True"
    events = loop.kube.items("events", loop.namespace)
    assert "ScaledUp" in {e["reason"] for e in events}
    # The engines' prefill-phase histogram and token counters reach the policy through
    # Prometheus: at least one scale-up was sized from the load, not only from latency.
    scaled = [e.get("message", "") for e in events if e["reason"] == "ScaledUp"]
    assert any("tokens/s per replica" in m for m in scaled), scaled
    # Once scaled, TTFT at the load generator is back near the 1 s SLO.
    tail = report.ttfts[-30:]
    assert sum(t <= 1.5 * TIME_SCALE for t in tail) / len(tail) > 0.8, tail


def test_every_dashboard_query_returns_series_for_the_running_model(loop: Stack) -> None:
    """Just after the long prompts: each panel's and annotation's query of the chart's
    dashboard, as Grafana would send it for this model, over the scrapes of its engines, its
    router and the operator."""
    empty = []
    for query in dashboards.queries():
        filled = dashboards.fill(query, loop.namespace, MODEL, "10m")
        answer = httpx.get(
            f"{loop.prom_url}/api/v1/query", params={"query": filled}, timeout=10
        ).json()
        assert answer["status"] == "success", (filled, answer)
        if not answer["data"]["result"]:
            empty.append(filled)
    assert empty == [], empty


def test_long_outputs_scale_decode_then_quiet_scales_both_down(loop: Stack) -> None:
    wait_for(
        "prefill back at its minimum",
        lambda: loop.replicas()["prefill"] == 1,
        timeout=120,
        interval=1,
    )
    with ReplicaRecorder(loop) as timeline:
        # Short prompts skip prefill; 400-token generations (~4 s each) at 3 req/s keep ~12
        # streams running, more than one decode engine's 8 sequences.
        report = asyncio.run(
            drive(loop.router.url, rate=3, seconds=35, prompt_tokens=100, max_tokens=400)
        )
        assert timeline.highest("decode") >= 2, timeline.samples
        assert timeline.highest("prefill") == 1, timeline.samples
        wait_for_minimum(loop, "both pools back at their minimum")
    assert report.failed == 0, report.errors[:5]


def test_decode_scales_down_while_traffic_continues_and_fails_no_request(loop: Stack) -> None:
    wait_for_minimum(loop)

    async def busy_then_light() -> tuple[LoadReport, LoadReport, float]:
        heavy = await drive(loop.router.url, rate=3, seconds=30, prompt_tokens=100, max_tokens=400)
        light_started = time.monotonic() - timeline.started
        # ~3 streams of 4 s each stay running: one engine's worth, so decode shrinks while
        # requests are in flight on the pods it removes.
        light = await drive(
            loop.router.url, rate=0.7, seconds=60, prompt_tokens=100, max_tokens=400
        )
        return heavy, light, light_started

    with ReplicaRecorder(loop) as timeline:
        heavy, light, light_started = asyncio.run(busy_then_light())
        light_ended = time.monotonic() - timeline.started
    peak = timeline.highest("decode")
    assert peak >= 2, timeline.samples
    during_light = [s["decode"] for t, s in timeline.samples if light_started <= t <= light_ended]
    assert min(during_light) < max(during_light), (light_started, timeline.samples)
    assert heavy.failed == 0 and light.failed == 0, (heavy.errors + light.errors)[:5]
    # The operator marked the pods it wanted removed, and the removed pods drained first.
    events = loop.kube.items("events", loop.namespace)
    assert "ScaledDown" in {e["reason"] for e in events}
    pods = loop.kube.items("pods", loop.namespace)
    assert any(DELETION_COST in p["metadata"].get("annotations", {}) for p in pods), pods
    emulator_log = (LOG_DIR / f"podemu-{loop.namespace}.log").read_text()
    assert "disagg-drain: drained" in emulator_log, emulator_log[-2000:]
    assert "still busy" not in emulator_log


def test_prompts_too_long_for_the_ttft_slo_are_reported_not_scaled_for(loop: Stack) -> None:
    wait_for_minimum(loop)
    earlier = {e["metadata"]["name"] for e in loop.kube.items("events", loop.namespace)}
    seen: list[dict[str, Any]] = []

    async def mixed() -> list[LoadReport]:
        async def watch() -> None:
            while True:
                seen.append(await asyncio.to_thread(loop.condition, "ScalingLimited"))
                await asyncio.sleep(1)

        watcher = asyncio.create_task(watch())
        try:
            # 40k-token prompts take over 2 s of prefill alone on one TP1 engine, twice the
            # 1 s TTFT SLO: no number of replicas serves them in time.
            return list(await asyncio.gather(
                drive(loop.router.url, rate=2, seconds=30, prompt_tokens=1_000, max_tokens=8),
                drive(loop.router.url, rate=0.3, seconds=30, prompt_tokens=40_000, max_tokens=8),
            ))  # fmt: skip
        finally:
            watcher.cancel()

    with ReplicaRecorder(loop) as timeline:
        reports = asyncio.run(mixed())
    assert all(r.failed == 0 for r in reports), [r.errors[:3] for r in reports]
    limited = [c["message"] for c in seen if c.get("reason") == "SLOUnreachable"]
    assert limited, seen
    assert "prefill: " in limited[-1] and "in prefill alone on TP1" in limited[-1], limited
    assert re.search(r"TP([2-9]|\d\d+) would serve them", limited[-1]), limited
    events = [
        e for e in loop.kube.items("events", loop.namespace)
        if e["metadata"]["name"] not in earlier
    ]  # fmt: skip
    warnings = [e["message"] for e in events if e["reason"] == "SLOUnreachable"]
    assert any("of prompts take longer than the 1s TTFT SLO" in w for w in warnings), warnings
    # Their TTFT p99 drives no scale-up: the pool may grow for the load they bring (each
    # keeps an engine busy for seconds), never because they miss the SLO.
    ups = [e["message"] for e in events if e["reason"] == "ScaledUp"]
    by_latency = [m for m in ups if m.startswith("prefill") and ": scale up: TTFT" in m]
    assert not by_latency, (by_latency, timeline.samples)
    # They are what the TTFT SLO's error budget is spent on: counted in status from the
    # engines' histograms, and the lower budget in `kubectl get dm`'s Budget column.
    budget = wait_for(
        "the TTFT budget counts the long prompts' misses",
        lambda: b if (b := loop.model()["status"].get("sloBudget", {})).get("ttft", {}).get(
            "missed", 0) >= 1 else None,
        timeout=60,
    )  # fmt: skip
    ttft = budget["ttft"]
    assert ttft["requests"] > ttft["missed"] and ttft["remainingFraction"] < 1, budget
    assert budget["window"] == "672h", budget
    table = loop.kube.run("get", "dm", MODEL, "-n", loop.namespace).stdout
    header, row = table.splitlines()[:2]
    assert "BUDGET" in header and re.search(r" (-?\d+\.\.)?-?\d+% \((TTFT|TPOT)\) ", row), table
    # The operator exports the same count for the chart's burn-rate alerts.
    ttft_series = f'model="{MODEL}",model_namespace="{loop.namespace}",slo="ttft"'
    exported = loop.operator.metrics()
    assert exported[f"disagg_slo_missed_total{{{ttft_series}}}"] >= 1, exported
    assert exported[f"disagg_slo_requests_total{{{ttft_series}}}"] > 1, exported


def test_prometheus_down_holds_replicas_and_reports_metrics_unavailable(loop: Stack) -> None:
    before = loop.replicas()
    loop.prom.terminate()
    loop.prom.wait(timeout=20)
    cond = wait_for(
        "ScalingActive=False/MetricsUnavailable",
        lambda: (
            loop.condition("ScalingActive")
            if loop.condition("ScalingActive").get("reason") == "MetricsUnavailable"
            else None
        ),
        timeout=30,
    )
    assert cond["status"] == "False" and loop.kube.items("events", loop.namespace)
    assert loop.replicas() == before


def test_operator_restart_mid_scenario_changes_nothing(loop: Stack) -> None:
    before = loop.replicas()
    # What the autoscaler learned is in status, as the API server stores it (a field the
    # CRD's schema left out would be pruned without a word), and reads back whole.
    saved = loop.model()["status"]["autoscalerMemory"]
    recall = recalled(saved, "disaggregated", POOLS, time.time())
    assert recall.problems == [] and recall.kept is not None, recall.problems
    assert recall.memories["prefill"].recommendations and recall.memories["decode"].arrivals
    loop.operator.kill()
    loop.operator = Operator(
        loop.kube.layout,
        f"--namespace={loop.namespace}",
        "--no-leader-election",
        "--resync-seconds=5",
        log_name=f"autoscale-restart-{loop.namespace}",
    )
    wait_for(
        "the restarted operator to reconcile", lambda: loop.operator.reconciles() >= 2, timeout=30
    )
    assert loop.replicas() == before
    writes = loop.operator.writes(exclude=("Lease", "Event", "DisaggregatedModel"))
    assert not any(k for k in writes if 'kind="Deployment"' in k), writes
    reasons = {e.get("reason") for e in loop.kube.items("events", loop.namespace)}
    assert "AutoscalerMemoryUnreadable" not in reasons
    assert "LearningAgain" not in reasons  # the same engines: their speed stands

    # What the spec does not show (an image tag that moved, new GPUs) is said with an
    # annotation: the pools learn their speeds again, and no pod restarts for it.
    def templates() -> list[object]:
        return [
            (loop.kube.get("deployment", f"{MODEL}-{role}", loop.namespace) or {})["spec"][
                "template"
            ]
            for role in ("prefill", "decode")
        ]

    before_templates = templates()
    loop.kube.run("annotate", "dm", MODEL, "-n", loop.namespace, f"{RELEARN_ANNOTATION}=e2e")

    def learning_again() -> bool:
        return any(
            e.get("reason") == "LearningAgain" for e in loop.kube.items("events", loop.namespace)
        )

    wait_for("a LearningAgain event", learning_again, timeout=30)
    assert templates() == before_templates
