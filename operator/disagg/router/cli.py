"""``disagg router`` (and ``disagg-router``, the router image's entry point, which needs only
the router's own dependencies): run the P/D router with static endpoints or Kubernetes
discovery."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from aiohttp import web

from disagg import otel
from disagg.kube.client import KubeClient
from disagg.router.app import build_app
from disagg.router.deadline import HeaderDeadline
from disagg.router.discovery import watch_pool
from disagg.router.endpoints import POLICIES, Endpoint, Picker, Pool
from disagg.router.metrics import RouterMetrics
from disagg.router.prompt_blocks import DEFAULT_BLOCK_SIZE, TokenizerUnavailable, prompt_reader
from disagg.router.state import Router, RouterConfig
from disagg.routing.affinity import DEFAULT_BUDGET, LocalPrefill
from disagg.routing.offload import Offload


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an endpoint URL such as http://10.0.0.5:8000"
        )
    return text.rstrip("/")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``disagg router`` to the ``disagg`` parser."""
    add_arguments(sub.add_parser("router", help="the OpenAI-compatible P/D router"))


def main(argv: Sequence[str] | None = None) -> int:
    """``disagg-router``: the same flags as ``disagg router``."""
    parser = argparse.ArgumentParser(
        prog="disagg-router", description="the OpenAI-compatible P/D router"
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    """Every flag of the router, on ``cmd``."""
    cmd.add_argument("--host", default="0.0.0.0")
    cmd.add_argument("--port", type=int, default=8000)
    cmd.add_argument("--served-model-name", help="the only model name accepted (default: any)")
    cmd.add_argument("--backend", choices=("vllm", "sglang"), default="vllm", help="P/D protocol")
    cmd.add_argument(
        "--prefill", nargs="+", type=_url, default=[], metavar="URL", help="static prefill engines"
    )
    cmd.add_argument(
        "--decode", nargs="+", type=_url, default=[], metavar="URL", help="static decode engines"
    )
    cmd.add_argument(
        "--prefill-bootstrap-port", type=int, default=8998, help="SGLang bootstrap port (static)"
    )
    cmd.add_argument(
        "--colocated",
        action="store_true",
        help="one engine pool prefills and decodes: each request goes as sent to one of the "
        "--decode engines (path colocated); no prefill pool, no KV transfer",
    )
    cmd.add_argument("--discover", action="store_true", help="find engines by watching Pods")
    cmd.add_argument(
        "--namespace", default=os.environ.get("POD_NAMESPACE"), help="namespace of the pools"
    )
    cmd.add_argument("--prefill-selector", help="label selector of prefill pods")
    cmd.add_argument("--decode-selector", help="label selector of decode pods")
    cmd.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, then in-cluster)")
    cmd.add_argument(
        "--pd-threshold",
        type=int,
        default=256,
        help="prompts shorter than this many tokens skip prefill (0: never skip)",
    )
    cmd.add_argument(
        "--policy",
        choices=POLICIES,
        default="cache-aware",
        help="how an engine is picked: where the router sent the prompt's leading blocks "
        "before unless it is overloaded, else the less busy of two (cache-aware); by load "
        "alone (least-outstanding); round-robin; or a hash of the prompt's start",
    )
    cmd.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="the model's tokenizer.json (or its directory) for cache-aware block counts "
        "(default: four characters per token)",
    )
    cmd.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per KV block, as the engines use (cache-aware)",
    )
    cmd.add_argument(
        "--local-prefill-max-tokens",
        type=int,
        default=LocalPrefill.max_uncached_tokens,
        help="a decode engine holding all but this many of a prompt's tokens prefills it "
        "itself, without the prefill pool (cache-aware; 0: never)",
    )
    cmd.add_argument(
        "--local-prefill-min-cached",
        type=float,
        default=LocalPrefill.min_cached_fraction,
        help="... and holding at least this fraction of the prompt",
    )
    cmd.add_argument(
        "--offload-max-tokens",
        type=int,
        default=0,
        help="while the prefill pool is backed up, a decode engine prefills prompts of up to "
        "this many tokens itself (0: never)",
    )
    cmd.add_argument(
        "--offload-wait",
        type=float,
        default=1.0,
        help="seconds a prompt would wait at the least backed-up prefill engine before "
        "short prompts are offloaded",
    )
    cmd.add_argument(
        "--offload-per-decode",
        type=int,
        default=1,
        help="offloaded prompts one decode engine prefills at once",
    )
    cmd.add_argument(
        "--affinity-blocks",
        type=int,
        default=DEFAULT_BUDGET,
        help="prompt blocks the router remembers per pool (cache-aware; about 120 bytes each)",
    )
    cmd.add_argument(
        "--prefill-timeout", type=float, default=60.0, help="seconds before a prefill is retried"
    )
    cmd.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    cmd.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="seconds a client may take to send its request body",
    )
    cmd.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a new client connection may take to send its first request headers",
    )
    cmd.add_argument(
        "--idle-timeout",
        type=float,
        default=75.0,
        help="seconds an idle keep-alive client connection stays open",
    )
    cmd.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="on SIGTERM, seconds to let requests in flight finish before they are cut",
    )
    cmd.add_argument(
        "--max-upstream-connections",
        type=int,
        default=1024,
        help="open connections to the engines at most (more requests wait for one)",
    )
    cmd.add_argument(
        "--otlp-endpoint",
        type=_url,
        help="trace requests (OpenTelemetry): the OTLP/HTTP traces URL, e.g. "
        "http://otel-collector:4318/v1/traces (needs the 'tracing' extra)",
    )
    cmd.add_argument(
        "--trace-sampling-ratio",
        type=float,
        default=0.1,
        help="share of requests traced when they arrive without a sampled traceparent",
    )
    cmd.add_argument(
        "--otlp-service-name", default="disagg-router", help="service.name of the router's spans"
    )
    cmd.set_defaults(func=cmd_router)


def _check(args: argparse.Namespace) -> str | None:
    if args.colocated and (args.prefill or args.prefill_selector):
        return "--colocated has no prefill pool: drop --prefill / --prefill-selector"
    if args.discover:
        needed = (
            ("namespace", "decode_selector")
            if args.colocated
            else ("namespace", "prefill_selector", "decode_selector")
        )
        missing = [f for f in needed if not getattr(args, f)]
        if missing:
            return "--discover needs " + ", ".join("--" + m.replace("_", "-") for m in missing)
    elif not args.decode:
        return "give --decode URL [URL ...] (and --prefill URL ...), or --discover"
    if args.pd_threshold < 0:
        return f"--pd-threshold must be >= 0, got {args.pd_threshold}"
    for flag in (
        "header_timeout",
        "body_timeout",
        "idle_timeout",
        "prefill_timeout",
        "drain_timeout",
    ):
        if not getattr(args, flag) > 0:
            return f"--{flag.replace('_', '-')} must be a positive number of seconds"
    if args.max_upstream_connections < 1 or args.max_body_bytes < 1:
        return "--max-upstream-connections and --max-body-bytes must be at least 1"
    if args.block_size < 1 or args.affinity_blocks < 1:
        return "--block-size and --affinity-blocks must be at least 1"
    if args.local_prefill_max_tokens < 0:
        return f"--local-prefill-max-tokens must be >= 0, got {args.local_prefill_max_tokens}"
    if not 0 <= args.local_prefill_min_cached <= 1:
        return f"--local-prefill-min-cached must be in [0, 1], got {args.local_prefill_min_cached}"
    if args.offload_max_tokens < 0:
        return f"--offload-max-tokens must be >= 0, got {args.offload_max_tokens}"
    if not (math.isfinite(args.offload_wait) and args.offload_wait > 0):
        return f"--offload-wait must be a positive number of seconds, got {args.offload_wait}"
    if args.offload_per_decode < 1:
        return f"--offload-per-decode must be at least 1, got {args.offload_per_decode}"
    if not 0 <= args.trace_sampling_ratio <= 1:
        return f"--trace-sampling-ratio must be within 0..1, got {args.trace_sampling_ratio:g}"
    return None


async def _serve(args: argparse.Namespace) -> int:
    prefill, decode = Pool("prefill"), Pool("decode")
    prefill.replace(Endpoint(u, bootstrap_port=args.prefill_bootstrap_port) for u in args.prefill)
    decode.replace(Endpoint(u) for u in args.decode)
    config = RouterConfig(
        served_model_name=args.served_model_name,
        colocated=args.colocated,
        pd_threshold=args.pd_threshold,
        backend=args.backend,
        prefill_timeout=args.prefill_timeout,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        max_upstream_connections=args.max_upstream_connections,
        local_prefill=(
            LocalPrefill(args.local_prefill_max_tokens, args.local_prefill_min_cached)
            if args.local_prefill_max_tokens > 0
            else None
        ),
        offload=(
            Offload(args.offload_max_tokens, args.offload_wait, args.offload_per_decode)
            if args.offload_max_tokens > 0
            else None
        ),
    )
    try:
        prompts = prompt_reader(args.tokenizer, args.block_size)
    except TokenizerUnavailable as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    picker = Picker(args.policy, affinity_budget=args.affinity_blocks)
    router = Router(config, prefill, decode, picker, RouterMetrics(), prompts=prompts)
    tasks: list[asyncio.Task[None]] = []
    client = None
    if args.discover:
        client = await KubeClient.connect(args.kubeconfig)
        tasks = [
            asyncio.create_task(watch_pool(client, args.namespace, args.decode_selector, decode))
        ]
        if not args.colocated:
            tasks.append(
                asyncio.create_task(
                    watch_pool(client, args.namespace, args.prefill_selector, prefill)
                )
            )
    deadline = HeaderDeadline(
        args.header_timeout, router.metrics.client_timeouts.labels(phase="headers").inc
    )
    runner = web.AppRunner(
        build_app(router, [deadline.middleware]),
        access_log=None,
        handler_cancellation=True,
        keepalive_timeout=args.idle_timeout,
        shutdown_timeout=args.drain_timeout,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as failure:
        await runner.cleanup()
        reason = (
            "is already in use"
            if failure.errno == errno.EADDRINUSE
            else f"failed: {failure.strerror}"
        )
        print(f"error: listening on {args.host}:{args.port} {reason}", file=sys.stderr)
        return 1
    tasks.append(
        asyncio.create_task(
            deadline.enforce(lambda: runner.server.connections if runner.server else ()),
            name="header deadline",
        )
    )
    logging.getLogger("disagg.router").info(
        "Router listening on %s:%d (%s, %s, %s%s)",
        args.host,
        args.port,
        args.backend,
        "colocated" if args.colocated else f"threshold {args.pd_threshold} tokens",
        args.policy,
        f", {prompts.description}" if picker.cache_aware else "",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await runner.cleanup()
    if client is not None:
        await client.close()
    return 0


def cmd_router(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    attributes = {"disagg.served_model_name": args.served_model_name or ""}
    if args.namespace:
        attributes["k8s.namespace.name"] = args.namespace
    traced = otel.exporting(
        args.otlp_endpoint, args.trace_sampling_ratio, args.otlp_service_name, attributes
    )
    try:
        with traced:
            return asyncio.run(_serve(args))
    except otel.TracingUnavailable as problem_:
        print(f"error: {problem_}", file=sys.stderr)
        return 2
