"""Prometheus for the local control plane: Debian's prometheus, discovering engine and router
pods through the real API server with the relabeling the docs recommend."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disagg.devcluster.layout import Layout
from disagg.yamlio import dump


def scrape_config(kubeconfig: Path | None, interval: str = "15s") -> dict[str, Any]:
    """The scrape job for engine and router pods (pure): what users put in prometheus.yml.

    In a cluster, leave out ``kubeconfig_file`` (Prometheus then uses its service account) or
    use the chart's PodMonitor, which carries the same relabeling.
    """
    discovery: dict[str, Any] = {"role": "pod"}
    if kubeconfig is not None:
        discovery["kubeconfig_file"] = str(kubeconfig)
    return {
        "job_name": "disagg-engines",
        "scrape_interval": interval,
        "kubernetes_sd_configs": [discovery],
        "relabel_configs": [
            # Only engine and router pods of a DisaggregatedModel, on their HTTP port.
            {
                "source_labels": ["__meta_kubernetes_pod_label_disagg_dev_role"],
                "regex": "prefill|decode|engine|router",
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": "http",
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "Running",
                "action": "keep",
            },
            # The pool identity the autoscaler's queries select on.
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {
                "source_labels": ["__meta_kubernetes_pod_label_disagg_dev_model"],
                "target_label": "disagg_model",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_label_disagg_dev_role"],
                "target_label": "disagg_role",
            },
        ],
    }


def harness_scrape_config(sd_url: str, interval: str) -> dict[str, Any]:
    """The same job, fed by the pod emulator's HTTP service discovery (see podemu)."""
    job = scrape_config(None, interval)
    del job["kubernetes_sd_configs"]
    job["http_sd_configs"] = [{"url": sd_url, "refresh_interval": "2s"}]
    return job


@dataclass(frozen=True)
class StaticTarget:
    """A process scraped at a fixed address (a router or an operator run outside a pod), with
    the labels a cluster's relabeling would give it."""

    job: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)


def static_jobs(targets: Sequence[StaticTarget], interval: str) -> list[dict[str, Any]]:
    """One scrape job per target's job name (pure)."""
    jobs: dict[str, dict[str, Any]] = {}
    for target in targets:
        job = jobs.setdefault(
            target.job,
            {"job_name": target.job, "scrape_interval": interval, "static_configs": []},
        )
        job["static_configs"].append({"targets": [target.address], "labels": dict(target.labels)})
    return list(jobs.values())


def start(
    layout: Layout,
    port: int,
    sd_url: str,
    interval: str = "1s",
    static: Sequence[StaticTarget] = (),
) -> subprocess.Popen[bytes]:
    """Start Prometheus on 127.0.0.1:port with a fresh TSDB, scraping the engine pods the
    emulator's discovery lists and the ``static`` targets; the caller stops it."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed: run `make system-packages`")
    root = layout.root / "prometheus"
    shutil.rmtree(root / "data", ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            harness_scrape_config(sd_url, interval),
            *static_jobs(static, interval),
        ],
    }
    (root / "prometheus.yml").write_text(dump(config))
    with (layout.logs / "prometheus.log").open("ab") as log:
        return subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=2h",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
