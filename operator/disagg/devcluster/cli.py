"""``disagg dev up|down|status|env``: the local control plane from the command line."""

from __future__ import annotations

import argparse
import sys

from disagg.devcluster.layout import COMPONENTS, Layout, default_state_dir
from disagg.devcluster.prepare import ClusterError, find_binaries
from disagg.devcluster.runner import (
    down,
    env_lines,
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
    register_emulator(actions)


def cmd_emulate(args: argparse.Namespace) -> int:
    """Run the pod emulator (and its service-discovery endpoint) until interrupted."""
    import asyncio
    import contextlib
    import logging
    import signal

    from aiohttp import web

    from disagg.devcluster.podemu import PodEmulator
    from disagg.kube.client import KubeClient

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    layout = _layout(args)

    async def main() -> None:
        client = await KubeClient.connect(str(layout.kubeconfig))
        emulator = PodEmulator(
            client, args.namespace, args.time_scale, args.sim_arg or [], layout.logs / "pods",
            router_kubeconfig=str(layout.kubeconfig) if args.routers else None,
        )  # fmt: skip

        async def targets(_: web.Request) -> web.Response:
            return web.json_response(emulator.discovery_targets())

        app = web.Application()
        app.add_routes([web.get("/sd", targets)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.sd_port).start()
        try:
            await emulator.run()
        finally:
            await runner.cleanup()
            await emulator.close()
            await client.close()

    async def until_signalled() -> None:
        # SIGTERM and SIGINT stop the simulators too: orphans would keep answering on pod IPs
        # that kwok hands to new pods.
        task = asyncio.create_task(main())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(until_signalled())
    return 0


def register_emulator(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    emulate = actions.add_parser("emulate-pods", help="run an engine simulator for each engine pod")
    emulate.add_argument("--namespace", help="only this namespace (default: all)")
    emulate.add_argument("--time-scale", type=float, default=0.1, help="simulator time scale")
    emulate.add_argument(
        "--sd-port",
        type=int,
        default=9091,
        help="port of the Prometheus HTTP service discovery endpoint (/sd)",
    )
    emulate.add_argument(
        "--sim-arg", action="append", help="extra `disagg sim engine` argument (repeatable)"
    )
    emulate.add_argument(
        "--routers",
        action="store_true",
        help="also run `disagg router` for router pods, with the pod's own arguments",
    )
    emulate.set_defaults(func=cmd_emulate)
