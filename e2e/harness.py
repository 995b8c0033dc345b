"""Helpers of the e2e suite: kubectl, polling for conditions, the operator as a process."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from disagg.demo.procs import LOG_DIR, Kube, Operator, Timeout, wait_for
from disagg.devcluster.layout import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "manifests" / "examples"

__all__ = [
    "EXAMPLES",
    "ROOT",
    "Kube",
    "Operator",
    "Timeout",
    "condition",
    "example",
    "new_namespace",
    "scoped_operator",
    "wait_for",
]


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """A condition of an object's status, or None."""
    if obj is None:
        return None
    for cond in obj.get("status", {}).get("conditions", []):
        if cond.get("type") == type_:
            c: dict[str, Any] = cond
            return c
    return None


def example(name: str) -> dict[str, Any]:
    """An example model from manifests/examples, without its namespace (a test applies it in
    its own)."""
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    manifest["metadata"].pop("namespace", None)
    return manifest


def new_namespace(kube: Kube) -> str:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kube.run("create", "namespace", name)
    # The controller-manager creates it; after an API server restart (e2e/test_restart.py)
    # its watches back off for up to a minute before it sees new namespaces.
    wait_for(
        f"the default ServiceAccount in {name}",
        lambda: kube.get("serviceaccount", "default", name),
        timeout=90,
    )
    return name


def scoped_operator(kube: Kube, namespace: str, log_name: str, *extra: str) -> Operator:
    """An operator of its own, watching only ``namespace`` and resyncing every 2 s, so the
    writes it counts are the test's alone."""
    return Operator(
        kube.layout,
        f"--namespace={namespace}",
        "--no-leader-election",
        "--resync-seconds=2",
        *extra,
        log_name=log_name,
    )


@contextmanager
def emulated_pods(namespace: str, log_name: str, time_scale: float) -> Iterator[None]:
    """The pod emulator for ``namespace``, routers included: every pod the operator creates
    runs (an engine simulator, or ``disagg router`` with the rendered arguments)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / f"podemu-{log_name}-{namespace}.log").open("wb") as log:
        emulator = subprocess.Popen(
            [
                sys.executable, "-m", "disagg.cli", "dev", "emulate-pods",
                "--namespace", namespace, "--time-scale", f"{time_scale:g}", "--routers",
                "--sd-port", str(free_port()),
            ],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield
    finally:
        emulator.terminate()
        try:
            emulator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            emulator.kill()
