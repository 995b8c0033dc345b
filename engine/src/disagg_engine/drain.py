"""``disagg-engine drain``: the engine pod's preStop hook.

Kubernetes runs it when the pod is being deleted (a scale-down, a rollout). The router has
already stopped sending new requests to a terminating pod; this waits, bounded by
``--timeout`` (under terminationGracePeriodSeconds), until the engine reports no running or
waiting request and, on a prefill engine, no KV cache still lent to a decode engine, so that
removing the pod fails no in-flight request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Final

POLL_SECONDS: Final = 0.5
_BUSY_GAUGES: Final = (
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "sglang:num_running_reqs", "sglang:num_queue_reqs",
)  # fmt: skip


def busy_requests(metrics_text: str) -> float:
    """Running plus waiting requests in a Prometheus exposition (pure)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(_BUSY_GAUGES):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _get(url: str) -> str | None:
    # Imported here, not at the top: urllib.request alone takes about 70 ms to import on a
    # small node, as long as the rest of the launcher, and only the drain needs it.
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode()
    except (urllib.error.URLError, OSError):
        return None


def drain(
    port: int, timeout: float, role: str, lease_seconds: float, host: str = "127.0.0.1"
) -> tuple[bool, str]:
    """Wait for the engine to go idle; returns (drained, what happened)."""
    base = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    quiet_polls = 0
    while time.monotonic() < deadline:
        text = _get(base + "/metrics")
        if text is None:
            return True, "the engine is not answering: nothing left to drain"
        busy = busy_requests(text)
        leased = 0
        state = _get(base + "/admin/state")  # the simulator reports lent KV exactly
        if state is not None:
            leased = int(json.loads(state).get("kv_leased_requests", 0))
        quiet_polls = quiet_polls + 1 if busy == 0 and leased == 0 else 0
        if quiet_polls >= 2:
            if role == "prefill" and state is None and lease_seconds > 0:
                # vLLM does not export lent blocks: wait out their lease (or the deadline).
                time.sleep(max(0.0, min(lease_seconds, deadline - time.monotonic())))
            return True, "drained"
        time.sleep(POLL_SECONDS)
    return False, f"still busy after {timeout:.0f}s; the pod is removed anyway"


def cmd_drain(args: argparse.Namespace) -> int:
    role = os.environ.get("DISAGG_ROLE", "decode")
    drained, what = drain(args.port, args.timeout, role, args.kv_lease_seconds, args.host)
    print(f"disagg-drain: {what}", file=sys.stderr, flush=True)
    return 0 if drained else 1


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``drain`` to an engine tools parser."""
    cmd = actions.add_parser("drain", help="preStop hook: wait until the engine is idle")
    cmd.add_argument("--port", type=int, default=8000, help="the engine's HTTP port")
    cmd.add_argument(
        "--host", default="127.0.0.1", help="the engine's address (in a pod: its own loopback)"
    )
    cmd.add_argument("--timeout", type=float, default=110.0, help="give up after this many seconds")
    cmd.add_argument(
        "--kv-lease-seconds",
        type=float,
        default=30.0,
        help="prefill: how long vLLM keeps lent KV (its kv_lease_duration)",
    )
    cmd.set_defaults(func=cmd_drain)
