"""Child processes of the `disagg` command (engines, routers, operators) for the demo and tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from disagg.devcluster.layout import Layout, free_port
from disagg.devcluster.prepare import Binaries, find_binaries
from disagg.devcluster.runner import up

T = TypeVar("T")

LOG_DIR = Path(os.environ.get("DISAGG_TEST_LOGS", "/tmp/disagg-e2e-logs"))


@dataclass
class Proc:
    """A `disagg ...` child process serving HTTP at ``url``."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=10).json()

    def post(self, path: str, body: Any) -> Any:
        return httpx.post(self.url + path, json=body, timeout=10).json()


def start(
    name: str, *args: str, url: str, ready_path: str = "/health", timeout: float = 20
) -> Proc:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{name}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "disagg.cli", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    proc = Proc(name, url, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"{name} exited with {process.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            if httpx.get(url + ready_path, timeout=1).status_code < 500:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{name} did not become ready at {url}: {log.read_text()[-2000:]}")


def long_prompt(tokens: int) -> str:
    """A prompt of ``tokens`` estimated tokens (four characters each) that shares no prefix
    block with any other: engines cache prefixes and the router follows them, so a load
    that repeated one prompt would measure neither prefill nor routing."""
    return (uuid.uuid4().hex + "abcd" * tokens)[: 4 * tokens]


class Timeout(AssertionError):
    pass


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise Timeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Kube:
    """kubectl against the local control plane."""

    binaries: Binaries
    layout: Layout

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binaries.kubectl), f"--kubeconfig={self.layout.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        obj: dict[str, Any] = json.loads(result.stdout)
        return obj

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace]
        if selector:
            args += ["-l", selector]
        items: list[dict[str, Any]] = self.json(*args)["items"]
        return items

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Wait until the API server serves a CRD. (`kubectl wait --for=condition=Established`
        fails at once, instead of waiting, while a new CRD's conditions are still null.)"""
        query = '{.status.conditions[?(@.type=="Established")].status}'

        def established() -> bool:
            result = self.run("get", "crd", crd, "-o", f"jsonpath={query}", check=False)
            return result.returncode == 0 and result.stdout.strip() == "True"

        wait_for(f"the API server to serve {crd}", established, timeout=timeout)

    def apply(
        self, manifest: str, namespace: str, *extra: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-n", namespace, *extra, "-f", "-", stdin=manifest, check=check)


def local_kube(layout: Layout, say: Callable[[str], None], crds: Path) -> Kube:
    """kubectl against the local control plane (started if it is not running), with the
    CRDs in ``crds`` applied."""
    up(layout, say)
    binaries = find_binaries()
    if binaries is None:
        raise RuntimeError("the control-plane binaries are missing: run `make binaries`")
    kube = Kube(binaries, layout)
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kube.wait_established("disaggregatedmodels.disagg.dev")
    return kube


class Operator:
    """``disagg run`` as a child process, with its metrics endpoint."""

    def __init__(
        self, layout: Layout, *args: str, log_name: str = "operator", port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.log_path = layout.logs / f"e2e-{log_name}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        argv = [
            sys.executable,
            "-m",
            "disagg.cli",
            "run",
            f"--kubeconfig={layout.kubeconfig}",
            f"--metrics-address=127.0.0.1:{self.port}",
            *args,
        ]
        self.process = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        wait_for("the operator's /readyz", self._ready, timeout=60)

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"the operator exited ({self.process.returncode}); log: {self.log_path}\n"
                + self.log_path.read_text()[-3000:]
            )
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics as ``name{labels}`` -> value."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def writes(self, exclude: tuple[str, ...] = ("Lease", "Event")) -> dict[str, float]:
        return {
            k: v
            for k, v in self.metrics().items()
            if k.startswith("disagg_operator_kube_writes_total")
            and not any(f'kind="{e}"' in k for e in exclude)
        }

    def reconciles(self, result: str | None = None) -> float:
        """Reconcile passes so far (those that ended with ``result``: ok, conflict, ...)."""
        return sum(
            v
            for k, v in self.metrics().items()
            if k.startswith("disagg_operator_reconcile_total")
            and (result is None or f'result="{result}"' in k)
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash or an OOM kill would do."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
