"""Prometheus for the local control plane: Debian's prometheus, discovering engine pods
through the real API server with the relabeling the docs recommend."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from disagg.devcluster.layout import Layout
from disagg.yamlio import dump


def scrape_config(kubeconfig: Path | None, interval: str = "15s") -> dict[str, Any]:
    """The scrape job for engine pods (pure): what users put in prometheus.yml.

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
            # Only engine pods of a DisaggregatedModel, on their HTTP port.
            {
                "source_labels": ["__meta_kubernetes_pod_label_disagg_dev_role"],
                "regex": "prefill|decode|engine",
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


def start(layout: Layout, port: int, sd_url: str, interval: str = "1s") -> subprocess.Popen[bytes]:
    """Start Prometheus on 127.0.0.1:port with a fresh TSDB; the caller stops it."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed: run `make system-packages`")
    root = layout.root / "prometheus"
    shutil.rmtree(root / "data", ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [harness_scrape_config(sd_url, interval)],
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
