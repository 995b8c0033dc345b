"""``disagg dev up|down|status|env``: the local control plane from the command line."""

from __future__ import annotations

import argparse
import sys

from disagg.devcluster.layout import COMPONENTS, Layout, default_state_dir
from disagg.devcluster.runner import (
    ClusterError,
    down,
    env_lines,
    find_binaries,
    kubectl,
    running_components,
    up,
)


def _say(message: str) -> None:
    print(f"disagg dev: {message}", file=sys.stderr, flush=True)


def _layout(args: argparse.Namespace) -> Layout:
    return Layout(args.state_dir)


def cmd_up(args: argparse.Namespace) -> int:
    layout = _layout(args)
    try:
        started = up(layout, _say)
    except ClusterError as error:
        _say(f"error: {error}")
        return 1
    _say("the control plane is up" if started else "the control plane is already running")
    print(
        f"# Use it with:\n{env_lines(layout)}"
        '# then: kubectl get nodes\n# Or: eval "$(disagg dev env)"'
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    down(_layout(args), _say)
    _say("the control plane is stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    layout = _layout(args)
    running = running_components(layout)
    for name in COMPONENTS:
        pid = running.get(name)
        state = f"running (pid {pid})" if pid else "stopped"
        print(f"{name:<24} {state:<24} log: {layout.log(name)}")
    binaries = find_binaries()
    if running.keys() == set(COMPONENTS) and binaries is not None:
        try:
            print(kubectl(binaries, layout, "get", "nodes", "-o", "wide", timeout=10))
        except ClusterError as error:
            print(f"the API server did not answer: {error}")
    return 0 if running.keys() == set(COMPONENTS) else 3


def cmd_env(args: argparse.Namespace) -> int:
    print(env_lines(_layout(args)), end="")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``dev`` command group to the ``disagg`` parser."""
    dev = sub.add_parser("dev", help="the local Kubernetes control plane (etcd, API server, kwok)")
    dev.add_argument(
        "--state-dir",
        default=default_state_dir(),
        help="where certificates, kubeconfig, logs and state live (default: %(default)s)",
    )
    actions = dev.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, func, text in (
        ("up", cmd_up, "start it (idempotent); builds the binaries on first use"),
        ("down", cmd_down, "stop every component"),
        ("status", cmd_status, "say what runs"),
        ("env", cmd_env, "print the export lines for KUBECONFIG and PATH"),
    ):
        action = actions.add_parser(name, help=text)
        action.set_defaults(func=func)
