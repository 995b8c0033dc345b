"""``disagg-engine launch -- <engine argv>``: the entrypoint of the bundled engine image.

The operator renders the engine command line and a few ``DISAGG_*`` variables; this fills in
what only the running pod knows (its IP for the NIXL side channel or SGLang's bootstrap, the
HCA ports and RoCE GID index when the spec left them to autodetection), checks RDMA, and then
replaces itself with the engine (``exec``), so the engine is PID 1's direct heir and gets the
pod's signals.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from disagg_engine.preflight import Findings, preflight

EX_CONFIG = 78


@dataclass
class Plan:
    """What the launcher will do: the engine's environment and what to tell the user."""

    env: dict[str, str]
    notes: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)


def plan_launch(env: Mapping[str, str], findings: Findings | None) -> Plan:
    """The engine's environment from the rendered one and the preflight findings (pure)."""
    plan = Plan(env=dict(env))
    pod_ip = env.get("POD_IP", "")
    backend = env.get("DISAGG_BACKEND", "vllm")
    if pod_ip:
        key = "VLLM_NIXL_SIDE_CHANNEL_HOST" if backend == "vllm" else "SGLANG_HOST_IP"
        if not plan.env.get(key):
            plan.env[key] = pod_ip
            plan.notes.append(f"{key}={pod_ip} (pod IP)")
    if findings is None:
        return plan
    fallback = env.get("DISAGG_RDMA_TCP_FALLBACK", "false").lower() == "true"
    if not findings.usable:
        if fallback:
            plan.notes += [f"WARNING: {p}" for p in findings.problems]
            plan.notes.append(
                "WARNING: RDMA is not usable; continuing with TCP (spec allows TCP fallback). "
                "KV transfer will be much slower."
            )
            plan.env.pop("UCX_NET_DEVICES", None)
        else:
            plan.fatal = findings.problems
        return plan
    if findings.ucx_net_devices and not env.get("UCX_NET_DEVICES"):
        plan.env["UCX_NET_DEVICES"] = findings.ucx_net_devices
        plan.notes.append(f"UCX_NET_DEVICES={findings.ucx_net_devices} (detected)")
    if findings.gid_index is not None and not env.get("UCX_IB_GID_INDEX"):
        plan.env["UCX_IB_GID_INDEX"] = str(findings.gid_index)
        plan.notes.append(f"UCX_IB_GID_INDEX={findings.gid_index} (RoCE v2, detected)")
    return plan


def _say(message: str) -> None:
    print(f"disagg-launch: {message}", file=sys.stderr, flush=True)


def launch(argv: list[str], env: Mapping[str, str]) -> NoReturn:
    """Check, fill in, and exec the engine; exits non-zero with a reason when it must not start."""
    if not argv:
        _say("error: no engine command given (usage: disagg-engine launch -- vllm serve ...)")
        sys.exit(2)
    findings = None
    if env.get("DISAGG_TRANSPORT", "tcp") == "rdma":
        findings = preflight(
            Path(env.get("DISAGG_SYSFS_ROOT", "/sys")),
            Path(env.get("DISAGG_DEV_ROOT", "/dev")),
            env.get("UCX_NET_DEVICES"),
            env.get("UCX_IB_GID_INDEX"),
        )
        active = ", ".join(p.ucx_name for p in findings.ports if p.active) or "none"
        _say(
            f"RDMA preflight: active ports {active}; verbs {len(findings.verbs_devices)}; "
            f"pinning {'ok' if findings.can_pin_memory else 'NOT possible'}"
        )
    plan = plan_launch(env, findings)
    for note in plan.notes:
        _say(note)
    if plan.fatal:
        for problem in plan.fatal:
            _say(f"error: {problem}")
        _say(
            "error: network.transport is rdma and RDMA is not usable; refusing to start "
            "(set spec.network.rdma.allowTcpFallback to start on TCP instead)"
        )
        sys.exit(EX_CONFIG)
    _say(f"starting {argv[0]} as {env.get('DISAGG_ROLE', 'engine')}")
    try:
        os.execvpe(argv[0], argv, plan.env)
    except FileNotFoundError:
        _say(f"error: {argv[0]}: command not found in this image")
        sys.exit(127)
    except PermissionError:
        _say(f"error: {argv[0]}: not executable")
        sys.exit(126)


def cmd_launch(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    launch(command, os.environ)


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``launch`` to an engine tools parser."""
    run = actions.add_parser("launch", help="RDMA preflight, fill in pod settings, exec the engine")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the engine argv")
    run.set_defaults(func=cmd_launch)
