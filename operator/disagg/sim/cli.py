"""``disagg sim engine``: run one simulated vLLM engine process."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import sys
from collections.abc import Callable

from aiohttp import web

from disagg import otel
from disagg.perf import NETWORKS, EngineShape, gpu_profile, kv_capacity_tokens, model_profile
from disagg.perf.engine_buckets import VLLM_FLAG, vllm_custom_buckets
from disagg.sim.engine import Engine, EngineConfig, Faults
from disagg.sim.server import build_app


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than zero, got {text}")
        return value

    return parse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``disagg sim engine`` to the ``disagg`` parser."""
    sim = sub.add_parser("sim", help="simulators (no GPU needed)")
    kinds = sim.add_subparsers(dest="sim_command", required=True, metavar="SIMULATOR")
    eng = kinds.add_parser("engine", help="a vLLM-compatible engine process with a latency model")
    eng.add_argument("--role", choices=("prefill", "decode", "both"), default="both")
    eng.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (HTTP and KV channel)"
    )
    eng.add_argument("--port", type=int, default=8000)
    eng.add_argument("--served-model-name", default="sim-model")
    eng.add_argument("--model-profile", default="llama-3.1-8b", help="latency model of this model")
    eng.add_argument("--gpu-profile", default="h100", help="a100, h100 or h200")
    eng.add_argument("--tensor-parallel-size", type=_positive(int), default=1)
    eng.add_argument("--max-num-batched-tokens", type=_positive(int), default=8192)
    eng.add_argument("--max-num-seqs", type=_positive(int), default=256)
    eng.add_argument(
        "--kv-capacity-tokens",
        type=_positive(int),
        help="KV cache size in tokens (default: what the GPU memory holds)",
    )
    eng.add_argument(
        "--time-scale",
        type=_positive(float),
        default=1.0,
        help="wall seconds per simulated second (0.1 runs ten times faster)",
    )
    eng.add_argument(
        "--network",
        choices=sorted(NETWORKS),
        default="ib400",
        help="link the KV cache crosses (decode side)",
    )
    eng.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse cached prompt blocks, on by default as in vLLM (a load that repeats one "
        "prompt then measures almost no prefill; --no-enable-prefix-caching turns it off)",
    )
    eng.add_argument(
        "--block-size", type=_positive(int), default=16, help="tokens per prefix-cache block"
    )
    eng.add_argument("--kv-port", type=int, default=5600, help="KV side-channel port (0: any free)")
    eng.add_argument(
        "--kv-bytes-scale",
        type=_positive(float),
        default=1e-4,
        help="fraction of the real KV bytes actually sent over TCP",
    )
    eng.add_argument(
        "--kv-lease-seconds",
        type=_positive(float),
        default=30.0,
        help="simulated seconds a prefill engine keeps lent KV",
    )
    eng.add_argument(
        "--advertise-host", help="host announced in kv_transfer_params (default: --host or $POD_IP)"
    )
    eng.add_argument(
        "--custom-histogram-buckets",
        type=_histogram_buckets,
        default={},
        help="as vLLM's: JSON mapping a bucket family to its bounds (TTFT and inter-token apply)",
    )
    eng.add_argument(
        "--otlp-traces-endpoint",
        help="export a span per request (OTLP/HTTP traces URL), as vLLM's flag of that name; "
        "the service name is $OTEL_SERVICE_NAME's, and requests follow their traceparent's "
        "sampling decision ($OTEL_TRACES_SAMPLER_ARG for those without one)",
    )
    eng.add_argument("--fault-added-latency-ms", type=float, default=0.0)
    eng.add_argument("--fault-error-rate", type=float, default=0.0)
    eng.add_argument("--fault-crash-after", type=int)
    eng.set_defaults(func=cmd_engine)


def _histogram_buckets(text: str) -> dict[str, tuple[float, ...]]:
    """vLLM's --custom-histogram-buckets, refused as vLLM refuses it."""
    try:
        return vllm_custom_buckets([VLLM_FLAG, text])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _config(args: argparse.Namespace) -> EngineConfig:
    try:
        shape = EngineShape(
            model_profile(args.model_profile),
            gpu_profile(args.gpu_profile),
            args.tensor_parallel_size,
        )
    except KeyError as unknown:
        raise SystemExit(f"error: {unknown.args[0]}") from None
    capacity = args.kv_capacity_tokens or kv_capacity_tokens(shape)
    if capacity <= 0:
        raise SystemExit(
            f"error: {args.model_profile} does not fit on {args.tensor_parallel_size} x "
            f"{args.gpu_profile}; raise --tensor-parallel-size"
        )
    advertise = args.advertise_host or (
        os.environ.get("POD_IP") if args.host in ("0.0.0.0", "::") else args.host
    )
    return EngineConfig(
        served_model_name=args.served_model_name,
        role=args.role,
        shape=shape,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        kv_capacity_tokens=capacity,
        time_scale=args.time_scale,
        network=NETWORKS[args.network],
        kv_bytes_scale=args.kv_bytes_scale,
        kv_lease_seconds=args.kv_lease_seconds,
        advertise_host=advertise or "127.0.0.1",
        kv_port=args.kv_port,
        prefix_caching=args.enable_prefix_caching,
        block_size=args.block_size,
        histogram_buckets=args.custom_histogram_buckets,
    )


async def _serve(args: argparse.Namespace) -> None:
    faults = Faults(args.fault_added_latency_ms, args.fault_error_rate, args.fault_crash_after)
    engine = Engine(_config(args), faults)
    runner = web.AppRunner(build_app(engine), access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        await engine.start(args.host)
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as failure:
        await runner.cleanup()
        await engine.close()
        if failure.errno == errno.EADDRINUSE:
            raise SystemExit(
                f"error: {args.host}:{args.port} or KV port {args.kv_port} is already in use"
            ) from None
        raise SystemExit(
            f"error: cannot listen on {args.host}:{args.port}: {failure.strerror}"
        ) from None
    logging.getLogger("disagg.sim").info(
        "Simulated %s engine for %s listening on %s:%d (KV channel %d, time scale %g)",
        args.role,
        args.served_model_name,
        args.host,
        args.port,
        engine.kv_port,
        args.time_scale,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await engine.close()


def cmd_engine(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    ratio = 1.0
    if args.otlp_traces_endpoint:
        try:
            ratio = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1"))
        except ValueError as problem:
            raise SystemExit(f"error: {problem}") from None
    service = os.environ.get("OTEL_SERVICE_NAME", f"disagg-sim-{args.role}")
    try:
        with otel.exporting(args.otlp_traces_endpoint, ratio, service, {}):
            asyncio.run(_serve(args))
    except otel.TracingUnavailable as problem:
        raise SystemExit(f"error: {problem}") from None
    return 0
