"""The Grafana dashboard the chart ships (``metrics.dashboards``), from one source (pure).

``make manifests`` writes ``charts/disagg-operator/files/dashboards/disagg-model.json`` from
:func:`dashboard`; ``disagg demo`` draws the same panels from its Prometheus; tests check
that the file is this module's output, that every query parses (promtool), and, in e2e,
that every query returns series for a running model.

One dashboard per model (variables: namespace and model): its SLOs against their targets
as the router's clients see them, each SLO's error budget and burn rate, each pool's
desired and ready replicas with the autoscaler's resizes as annotations, how far each pool
is over its SLO, the router's paths, the KV transfers (vLLM's NIXL histograms) and the
prefix cache. The series come from three scrapes: the engine and router pods (the chart's
PodMonitor, labels ``namespace``, ``disagg_model``, ``disagg_role``) and the operator
(its ServiceMonitor, labels ``model_namespace``, ``model``).
"""

from __future__ import annotations

import json
from typing import Any, Final

UID: Final = "disagg-model"
RATE: Final = "$__rate_interval"
PODS: Final = 'namespace="$namespace", disagg_model="$model"'
"""Series scraped from the model's pods (engines and router)."""
OPERATOR: Final = 'model_namespace="$namespace", model="$model"'
"""Series the operator exports of the model."""

Panel = dict[str, Any]


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
    }


def _panel(
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    unit: str,
    grid: tuple[int, int, int, int],
) -> Panel:
    x, y, w, h = grid
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            _target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)
        ],
    }


def _p99(metric: str, extra: str = "") -> str:
    return f"histogram_quantile(0.99, sum by (le{extra}) (rate({metric}_bucket{{{PODS}}}[{RATE}])))"


def panels() -> list[Panel]:
    """Every panel, in reading order (a 24-column grid)."""
    router = 'disagg_role="router"'
    return [
        _panel(
            "TTFT p99 against its SLO",
            "Time to first token as the router's clients see it, and the SLO "
            "(spec.autoscaling.ttftP99).",
            [
                (_p99("disagg_router_time_to_first_token_seconds"), "TTFT p99"),
                (f'max(disagg_slo_target_seconds{{{OPERATOR}, slo="ttft"}})', "SLO"),
            ],
            "s",
            (0, 0, 12, 8),
        ),
        _panel(
            "TPOT p99 against its SLO",
            "Time between output tokens as the router's clients see them, and the SLO "
            "(spec.autoscaling.tpotP99).",
            [
                (_p99("disagg_router_inter_token_latency_seconds"), "TPOT p99"),
                (f'max(disagg_slo_target_seconds{{{OPERATOR}, slo="tpot"}})', "SLO"),
            ],
            "s",
            (12, 0, 12, 8),
        ),
        _panel(
            "Error budget remaining",
            "The share of each SLO's error budget left over its compliance window "
            "(spec.autoscaling.sloWindow): 1 untouched, below 0 overspent.",
            [(f"max by (slo) (disagg_slo_budget_remaining{{{OPERATOR}}})", "{{slo}}")],
            "percentunit",
            (0, 8, 12, 8),
        ),
        _panel(
            "Burn rate (1 h)",
            "Misses relative to what the target allows: 1 spends the budget exactly over "
            "the window; the page fires at 2% of the window's budget in an hour.",
            [
                (
                    f"sum by (slo) (rate(disagg_slo_missed_total{{{OPERATOR}}}[1h])) / "
                    f"sum by (slo) (rate(disagg_slo_requests_total{{{OPERATOR}}}[1h])) / 0.01",
                    "{{slo}}",
                )
            ],
            "none",
            (12, 8, 12, 8),
        ),
        _panel(
            "Replicas: desired and ready",
            "What the autoscaler decided for each pool at its last evaluation, and how many "
            "replicas are ready (the gap is provisioning).",
            [(f"max by (pool, state) (disagg_pool_replicas{{{OPERATOR}}})", "{{pool}} {{state}}")],
            "none",
            (0, 16, 12, 8),
        ),
        _panel(
            "Pressure the autoscaler acts on",
            "How far over its SLO each pool is as the autoscaler weighs it (1: at the SLO): its "
            "engines' p99 or its load gauges, whichever is higher, leaving out a p99 it reads "
            "as a backlog draining, as measured before new replicas served, or as prompts that "
            "miss at any size (each pool's lastScaleReason says which).",
            [(f"max by (pool) (disagg_pool_slo_pressure{{{OPERATOR}}})", "{{pool}}")],
            "none",
            (12, 16, 12, 8),
        ),
        _panel(
            "Router paths",
            "Requests by the path they took: disaggregated (prefill then decode), skipped "
            "(short prompts decoded alone), local-prefill (the decode engine held most of "
            "the prompt), offloaded, colocated, fallback (prefill failed: decode alone).",
            [
                (
                    f"sum by (path) (rate(disagg_router_requests_total{{{PODS}, {router}}}"
                    f"[{RATE}]))",
                    "{{path}}",
                )
            ],
            "reqps",
            (0, 24, 12, 8),
        ),
        _panel(
            "Prefix cache hits",
            "The share of prompt tokens each pool's engines found in their prefix cache.",
            [
                (
                    f"sum by (disagg_role) (rate(vllm:prefix_cache_hits_total{{{PODS}}}[{RATE}]))"
                    " / sum by (disagg_role) "
                    f"(rate(vllm:prefix_cache_queries_total{{{PODS}}}[{RATE}]))",
                    "{{disagg_role}}",
                )
            ],
            "percentunit",
            (12, 24, 12, 8),
        ),
        _panel(
            "KV transfer rate",
            "Bytes the decode engines pull from prefill engines (vLLM's NIXL connector).",
            [(f"sum(rate(vllm:nixl_bytes_transferred_sum{{{PODS}}}[{RATE}]))", "bytes/s")],
            "Bps",
            (0, 32, 12, 8),
        ),
        _panel(
            "KV transfer time p99",
            "How long one KV transfer takes (vLLM's NIXL connector): on the critical path of "
            "every disaggregated request's first token.",
            [(_p99("vllm:nixl_xfer_time_seconds"), "transfer p99")],
            "s",
            (12, 32, 12, 8),
        ),
        _panel(
            "Requests waiting and running",
            "Each pool's queue and batch, summed over its engines.",
            [
                (
                    f"sum by (disagg_role) (vllm:num_requests_waiting{{{PODS}}})",
                    "{{disagg_role}} waiting",
                ),
                (
                    f"sum by (disagg_role) (vllm:num_requests_running{{{PODS}}})",
                    "{{disagg_role}} running",
                ),
            ],
            "none",
            (0, 40, 24, 8),
        ),
    ]


def resize_annotations() -> list[dict[str, Any]]:
    """The autoscaler's resizes, marked on every panel."""
    return [
        {
            "name": "Resizes",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "enable": True,
            "iconColor": "orange",
            "expr": f"sum by (pool, direction) "
            f"(increase(disagg_autoscaler_scalings_total{{{OPERATOR}}}[{RATE}])) > 0",
            "step": "30s",
            "titleFormat": "{{pool}} scaled {{direction}}",
            "useValueForTime": False,
        }
    ]


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard's JSON model (Grafana 10+)."""
    return {
        "uid": UID,
        "title": "disagg: model",
        "description": "One DisaggregatedModel: SLOs, error budgets, replicas, router paths, "
        "KV transfers and the prefix cache.",
        "tags": ["disagg", "llm-serving"],
        "timezone": "browser",
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "schemaVersion": 39,
        "editable": True,
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                },
                _variable("namespace", "label_values(disagg_router_requests_total, namespace)"),
                _variable(
                    "model",
                    'label_values(disagg_router_requests_total{namespace="$namespace"}, '
                    "disagg_model)",
                ),
            ]
        },
        "annotations": {"list": resize_annotations()},
        "panels": panels(),
    }


def fill(query: str, namespace: str, model: str, window: str) -> str:
    """A query as Grafana sends it, its variables substituted."""
    return query.replace(RATE, window).replace("$namespace", namespace).replace("$model", model)


def queries() -> list[str]:
    """Every PromQL expression of the dashboard (its panels' and its annotations')."""
    found = [t["expr"] for p in panels() for t in p["targets"]]
    return found + [a["expr"] for a in resize_annotations()]


def as_json() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"
