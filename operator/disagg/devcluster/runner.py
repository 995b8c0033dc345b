"""Start, stop and inspect the local control plane (the imperative shell of devcluster).

Components run as detached processes (their own session, so Ctrl-C in the terminal that ran
``disagg dev up`` does not kill them); their pids are recorded in ``state.json`` and checked
against ``/proc/<pid>/cmdline`` before anything is signalled, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from disagg.devcluster import components
from disagg.devcluster.layout import COMPONENTS, Layout, Ports, State, cache_dir, port_in_use
from disagg.devcluster.nodes import fake_nodes
from disagg.devcluster.prepare import (
    Binaries,
    ClusterError,
    ensure_binaries,
    ensure_pki,
    write_kubeconfig,
)
from disagg.yamlio import dump_all

STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
READY_TIMEOUT = {"etcd": 30.0, "kube-apiserver": 120.0}
DEFAULT_READY_TIMEOUT = 60.0


def _pid_runs(pid: int, binary_name: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return Path(cmdline).name == binary_name


def _binary_name(component: str) -> str:
    return component


def running_components(layout: Layout) -> dict[str, int]:
    """Components recorded in state.json whose process still runs."""
    state = layout.load_state()
    if state is None:
        return {}
    return {c: pid for c, pid in state.pids.items() if _pid_runs(pid, _binary_name(c))}


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def _wait_ready(
    layout: Layout, comp: components.Component, process: subprocess.Popen[bytes]
) -> None:
    timeout = READY_TIMEOUT.get(comp.name, DEFAULT_READY_TIMEOUT)
    verify: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
        if comp.name == "kube-apiserver"
        else False
    )
    deadline = time.monotonic() + timeout
    with httpx.Client(verify=verify, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ClusterError(
                    f"{comp.name} exited with code {process.returncode} while starting; "
                    f"log: {layout.log(comp.name)}\n{_tail(layout.log(comp.name))}"
                )
            try:
                if client.get(comp.health_url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
    raise ClusterError(
        f"{comp.name} did not become ready within {timeout:.0f}s ({comp.health_url}); "
        f"log: {layout.log(comp.name)}\n{_tail(layout.log(comp.name))}"
    )


_DETACHED: list[subprocess.Popen[bytes]] = []
"""Components outlive this process by design; holding their Popen objects here keeps Python
from warning that a child is still running when the object would be collected."""


def _start(layout: Layout, comp: components.Component) -> subprocess.Popen[bytes]:
    layout.logs.mkdir(parents=True, exist_ok=True)
    with layout.log(comp.name).open("ab") as log:
        log.write(f"\n==== starting {comp.name} at {time.ctime()} ====\n".encode())
        log.flush()
        process = subprocess.Popen(
            comp.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _DETACHED.append(process)
    return process


def kubectl(
    binaries: Binaries, layout: Layout, *args: str, stdin: str | None = None, timeout: float = 60.0
) -> str:
    """Run kubectl against the local control plane; a failure raises ClusterError."""
    result = subprocess.run(
        [str(binaries.kubectl), f"--kubeconfig={layout.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def _component(binaries: Binaries, layout: Layout, ports: Ports, name: str) -> components.Component:
    builders = {
        "etcd": (components.etcd, binaries.etcd),
        "kube-apiserver": (components.kube_apiserver, binaries.kube_apiserver),
        "kube-controller-manager": (
            components.kube_controller_manager,
            binaries.kube_controller_manager,
        ),
        "kube-scheduler": (components.kube_scheduler, binaries.kube_scheduler),
        "kwok": (components.kwok, binaries.kwok),
    }
    build, binary = builders[name]
    return build(binary, layout, ports)


def up(layout: Layout, say: Callable[[str], None]) -> bool:
    """Start every component (idempotent). Returns False when it was already running."""
    binaries = ensure_binaries(say)
    running = running_components(layout)
    if set(running) == set(COMPONENTS):
        return False
    if running:
        say(f"restarting a partial control plane (running: {', '.join(sorted(running))})")
        down(layout, say)
    token = ensure_pki(layout)
    ports = Ports.allocate()
    for name, port in vars(ports).items():
        if port_in_use(port):
            raise ClusterError(f"port {port} ({name}) is already in use")
    write_kubeconfig(layout, ports, token)
    layout.kwok_config.write_text(STAGES_FILE.read_text())
    shutil.rmtree(layout.etcd_data, ignore_errors=True)
    state = State(ports=ports)
    try:
        for name in COMPONENTS:
            comp = _component(binaries, layout, ports, name)
            say(f"starting {name}")
            process = _start(layout, comp)
            state.pids[name] = process.pid
            layout.save_state(state)
            _wait_ready(layout, comp, process)
        say("creating fake GPU nodes")
        kubectl(
            binaries,
            layout,
            "apply",
            "--server-side",
            "--field-manager=disagg-dev",
            "-f",
            "-",
            stdin=dump_all(fake_nodes()),
        )
        kubectl(
            binaries,
            layout,
            "wait",
            "--for=condition=Ready",
            "node",
            "--all",
            "--timeout=60s",
            timeout=90,
        )
    except BaseException:
        down(layout, lambda _: None)
        raise
    return True


def restart(layout: Layout, name: str, say: Callable[[str], None]) -> None:
    """Stop one running component and start it again on the same ports and data: what a
    control-plane upgrade or a crashed API server does to the clients of a real cluster."""
    state = layout.load_state()
    pid = running_components(layout).get(name)
    if state is None or pid is None:
        raise ClusterError(f"{name} is not running; start the control plane with `disagg dev up`")
    say(f"restarting {name}")
    _stop_component(name, pid)
    comp = _component(ensure_binaries(say), layout, state.ports, name)
    process = _start(layout, comp)
    state.pids[name] = process.pid
    layout.save_state(state)
    _wait_ready(layout, comp, process)


def _stop_component(name: str, pid: int) -> None:
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _pid_runs(pid, _binary_name(name)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_runs(pid, _binary_name(name)):
        _signal_group(pid, signal.SIGKILL)
    _reap(pid)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def down(layout: Layout, say: Callable[[str], None]) -> None:
    """Stop every component and remove etcd's data; leaves no process behind."""
    running = running_components(layout)
    for name in reversed(COMPONENTS):
        pid = running.get(name)
        if pid is None:
            continue
        say(f"stopping {name}")
        _stop_component(name, pid)
    shutil.rmtree(layout.etcd_data, ignore_errors=True)
    state = layout.load_state()
    if state is not None:
        state.pids = {}
        layout.save_state(state)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def env_lines(layout: Layout) -> str:
    """Shell lines that point kubectl (and the operator) at the local control plane."""
    k8s_bin = cache_dir() / "bin" / "k8s"
    return f'export KUBECONFIG="{layout.kubeconfig}"\nexport PATH="{k8s_bin}:$PATH"\n'
