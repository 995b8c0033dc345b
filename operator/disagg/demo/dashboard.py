"""The chart's Grafana dashboard drawn from the demo's Prometheus: the same panels and queries
(:mod:`disagg.dashboards`), read over the story and drawn with matplotlib, so that the README
can show what an SRE's Grafana shows without a Grafana here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from disagg import dashboards

WINDOW = "1m"
"""The rate window the panels are read with (Grafana's $__rate_interval at the demo's 1 s
scrapes)."""
UNITS = {"s": "seconds", "percentunit": "share", "reqps": "req/s", "Bps": "bytes/s"}


@dataclass(frozen=True)
class Line:
    legend: str
    times: list[float]
    values: list[float]


@dataclass(frozen=True)
class PanelData:
    title: str
    unit: str
    lines: list[Line]


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def fetch(prom_url: str, namespace: str, model: str, start: float, end: float) -> list[PanelData]:
    """Every panel's series over [start, end] (Unix seconds), as Prometheus answers them."""
    step = max(2.0, (end - start) / 300)
    found = []
    with httpx.Client(timeout=30) as client:
        for panel in dashboards.panels():
            lines = []
            for target in panel["targets"]:
                query = dashboards.fill(target["expr"], namespace, model, WINDOW)
                answer = client.get(
                    f"{prom_url}/api/v1/query_range",
                    params={"query": query, "start": start, "end": end, "step": step},
                ).json()
                for series in answer.get("data", {}).get("result", []):
                    times = [float(t) - start for t, _ in series["values"]]
                    values = [float(v) for _, v in series["values"]]
                    lines.append(
                        Line(_legend(target["legendFormat"], series["metric"]), times, values)
                    )
            found.append(PanelData(panel["title"], panel["fieldConfig"]["defaults"]["unit"], lines))
    return found


def draw(panels: list[PanelData], path: Path, title: str) -> Path:
    """The panels in the dashboard's two columns, written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 2.6 * rows), sharex=True)
    flat: list[Any] = list(axes.flat)
    for ax, panel in zip(flat, panels, strict=False):
        for line in panel.lines:
            finite = [
                (t, v) for t, v in zip(line.times, line.values, strict=True) if math.isfinite(v)
            ]
            if finite:
                ax.plot(*zip(*finite, strict=True), label=line.legend, linewidth=1.2)
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.set_ylabel(UNITS.get(panel.unit, ""), fontsize=8)
        ax.tick_params(labelsize=8)
        if panel.lines:
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    for ax in flat[-2:]:
        ax.set_xlabel("seconds since the story started", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
