"""``disagg run``: the operator process (kopf in standalone mode, our own leader election)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from disagg.prometheus_access import add_flags, from_args
from disagg.reconcile.config import RunConfig
from disagg.versions import add_image_flags, images_from_args


def _config(args: argparse.Namespace) -> RunConfig:
    namespaces = tuple(ns for group in args.namespace or () for ns in group.split(",") if ns)
    host, _, port = args.metrics_address.rpartition(":")
    return RunConfig(
        kubeconfig=args.kubeconfig,
        namespaces=namespaces,
        metrics_host=host or "0.0.0.0",
        metrics_port=int(port),
        leader_election=args.leader_election,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        resync_seconds=args.resync_seconds,
        concurrency=args.concurrency,
        prometheus=from_args(args),
        images=images_from_args(args),
    )


def cmd_run(args: argparse.Namespace) -> int:
    if not args.metrics_address.rpartition(":")[2].isdigit():
        print(
            f"error: --metrics-address must be HOST:PORT, got {args.metrics_address!r}",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig:
        if not os.path.exists(args.kubeconfig):
            print(f"error: --kubeconfig {args.kubeconfig}: no such file", file=sys.stderr)
            return 2
        os.environ["KUBECONFIG"] = args.kubeconfig
    try:
        config = _config(args)
    except ValueError as error:  # AccessError is one too
        print(f"error: {error}", file=sys.stderr)
        return 2

    import kopf  # imported here so the rest of the CLI starts fast

    from disagg.reconcile.handlers import register

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("disagg").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # One line per handler call drowns what matters.
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    registry = kopf.OperatorRegistry()
    register(registry, config)
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            memo=kopf.Memo(),
        )
    )
    return 0


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``disagg run`` to the ``disagg`` parser."""
    run = sub.add_parser(
        "run", help="run the operator against the current kubeconfig or in-cluster"
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="watch only this namespace (repeatable or comma-separated; default: all namespaces)",
    )
    run.add_argument(
        "--metrics-address",
        default="0.0.0.0:8080",
        help="HOST:PORT of /metrics, /healthz and /readyz (default: %(default)s)",
    )
    run.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="only one replica reconciles at a time (default: on)",
    )
    run.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the leader-election Lease (default: $POD_NAMESPACE or default)",
    )
    run.add_argument("--lease-name", default="disagg-operator", help="name of the Lease")
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=300.0,
        help="how often every model is reconciled even without events",
    )
    run.add_argument("--concurrency", type=int, default=4, help="models reconciled at once")
    run.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_image_flags(run)
    add_flags(
        run,
        "Prometheus of the models that name none in spec.autoscaling.prometheusURL "
        "(default: %(default)s)",
    )
    run.set_defaults(func=cmd_run)
