"""`disagg diagnose`: the range queries against Prometheus, the verdict, and its report.

The only I/O is here: Prometheus's HTTP API (prometheus-api-client, with explicit timeouts and
no retries) and reading the optional manifest; everything it decides is in the pure modules.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.exceptions import RequestException

from disagg.api.base import parse_duration
from disagg.api.resource import KIND, ManifestError, parse_model
from disagg.autoscale.queries import prometheus_duration
from disagg.diagnose.advice import EngineFacts, NextStep, Traffic, next_step
from disagg.diagnose.report import to_json, to_text
from disagg.diagnose.series import Series, by_role, range_queries, timeline, traffic_queries
from disagg.diagnose.verdict import diagnose
from disagg.kube.client import KubeClient, KubeError
from disagg.kube.credentials import CredentialsError
from disagg.model_files import load_models
from disagg.perf import NETWORKS
from disagg.perf.profiles import gpu_profile, model_profile
from disagg.perf.roofline import EngineShape
from disagg.prometheus_access import AccessError, PrometheusAccess, add_flags, from_args
from disagg.slo import Slo

MAX_POINTS = 11_000
"""Prometheus refuses a range query of more points than this."""
DEFAULT_TTFT, DEFAULT_TPOT = 2.0, 0.05
"""The API's defaults for spec.autoscaling.ttftP99 and tpotP99."""


class DiagnoseError(RuntimeError):
    """Bad flags or an unreachable Prometheus: printed as one line, exit status 1."""


def _seconds(flag: str, text: str) -> float:
    try:
        value = parse_duration(text)
    except ValueError as error:
        raise DiagnoseError(f"{flag}: {error}") from None
    if value <= 0:
        raise DiagnoseError(f"{flag}: must be longer than 0s, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser(
        "diagnose",
        help="tell prefill interference from overload in a running model's metrics",
        description="Read a model's engine metrics from Prometheus and decide whether its TPOT "
        "p99 suffers from phase interference (spikes when long prompts arrive), overload "
        "(queues grow, every latency rises), or neither; print the evidence and the next step.",
    )
    cmd.add_argument("--prometheus", required=True, help="Prometheus base URL")
    add_flags(cmd)
    cmd.add_argument("--model", required=True, help="the DisaggregatedModel's metadata.name")
    cmd.add_argument("--namespace", default="default", help="its namespace")
    cmd.add_argument("--since", default="1h", help="how far back to look (default 1h)")
    cmd.add_argument("--step", help="resolution (default: since/120, at least 15s)")
    cmd.add_argument("--window", help="rate window of each step (default: twice the step)")
    cmd.add_argument("-f", "--file", help="the model's manifest: SLOs, backend, TP and budget")
    cmd.add_argument(
        "--kubeconfig",
        help="read the model from this cluster instead (default: $KUBECONFIG or ~/.kube/config "
        "or in-cluster, when reachable)",
    )
    cmd.add_argument(
        "--no-cluster", action="store_true", help="do not read the model from a cluster"
    )
    cmd.add_argument("--ttft-slo", help="TTFT p99 SLO, e.g. 2s (default: the manifest's, or 2s)")
    cmd.add_argument("--tpot-slo", help="TPOT p99 SLO, e.g. 50ms (default: manifest's, or 50ms)")
    cmd.add_argument("--backend", choices=("vllm", "sglang"), help="default: manifest's, or vllm")
    cmd.add_argument("--model-profile", help="latency model for a suggested chunk budget")
    cmd.add_argument("--gpu", default="h100", help="GPU profile (default h100)")
    cmd.add_argument(
        "--network",
        choices=sorted(NETWORKS),
        default="ib400",
        help="link a split's KV cache would cross, for the suggested `disagg plan` command",
    )
    cmd.add_argument("--tensor-parallel-size", type=int, help="TP of the pool that decodes")
    cmd.add_argument("--max-num-batched-tokens", type=int, help="its chunked-prefill budget now")
    cmd.add_argument("--timeout", default="10s", help="per query (default 10s)")
    cmd.add_argument("-o", "--output", choices=("text", "json"), default="text")
    cmd.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    try:
        report = run(args, time.time())
    except DiagnoseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.output == "json" else to_text(report), end="\n")
    return 0


def _from_cluster(
    kubeconfig: str | None, namespace: str, name: str, timeout: float
) -> dict[str, Any] | None:
    """The DisaggregatedModel from the cluster, or None when no cluster is configured; a
    DiagnoseError when the cluster answers no such model, or an explicit one is unreachable."""

    async def fetch() -> dict[str, Any] | None:
        client = await KubeClient.connect(kubeconfig)
        try:
            return await asyncio.wait_for(client.get(KIND, namespace, name), timeout)
        finally:
            await client.close()

    try:
        found = asyncio.run(fetch())
    except CredentialsError as error:
        if kubeconfig:
            raise DiagnoseError(f"--kubeconfig: {error}") from None
        return None
    except (KubeError, TimeoutError, OSError) as error:
        if kubeconfig:
            raise DiagnoseError(f"cannot read {KIND} {namespace}/{name}: {error}") from None
        print(
            f"warning: cannot read {KIND} {namespace}/{name} from the cluster ({error}); "
            "using flags and defaults",
            file=sys.stderr,
        )
        return None
    if found is None:
        raise DiagnoseError(f"no {KIND} {namespace}/{name} in the cluster (--no-cluster skips it)")
    return found


def _settings(args: argparse.Namespace) -> tuple[Slo, str, EngineFacts, str]:
    """SLOs, backend and engine facts from the flags, then the manifest or the cluster's
    model, then defaults; and where the model's settings came from."""
    spec = None
    source = "defaults"
    if args.file:
        models = [m for m in load_models(args.file) if m.metadata.name == args.model]
        if not models:
            raise DiagnoseError(f"{args.file}: no DisaggregatedModel named {args.model!r}")
        spec, source = models[0].spec, "manifest"
    elif not args.no_cluster:
        found = _from_cluster(
            args.kubeconfig, args.namespace, args.model, _seconds("--timeout", args.timeout)
        )
        if found is not None:
            try:
                spec, source = parse_model(found).spec, "cluster"
            except ManifestError as error:
                raise DiagnoseError(
                    f"{KIND} {args.namespace}/{args.model}: " + "; ".join(error.problems)
                ) from None
    ttft = (
        _seconds("--ttft-slo", args.ttft_slo) if args.ttft_slo
        else parse_duration(spec.autoscaling.ttft_p99) if spec else DEFAULT_TTFT
    )  # fmt: skip
    tpot = (
        _seconds("--tpot-slo", args.tpot_slo) if args.tpot_slo
        else parse_duration(spec.autoscaling.tpot_p99) if spec else DEFAULT_TPOT
    )  # fmt: skip
    backend = args.backend or (spec.runtime.backend if spec else "vllm")
    profile_name = args.model_profile or (spec.model.name if spec else None)
    try:
        gpu = gpu_profile(args.gpu)
    except KeyError as error:
        raise DiagnoseError(f"--gpu: {error.args[0]}") from None
    try:
        profile = model_profile(profile_name) if profile_name else None
    except KeyError as error:
        if args.model_profile:
            raise DiagnoseError(f"--model-profile: {error.args[0]}") from None
        profile = None  # a model the latency model does not know: no suggested budget
    tp = args.tensor_parallel_size or (spec.decode.tensor_parallel_size if spec else 1)
    budget = args.max_num_batched_tokens or (spec.decode.max_num_batched_tokens if spec else None)
    for flag, value in (("--tensor-parallel-size", tp), ("--max-num-batched-tokens", budget)):
        if value is not None and value < 1:
            raise DiagnoseError(f"{flag}: must be at least 1, got {value}")
    shape = EngineShape(profile, gpu, tp) if profile else None
    facts = EngineFacts(shape, budget, profile.name if profile else None, gpu.name, args.network)
    return Slo(ttft, tpot), backend, facts, source


def _client(url: str, access: PrometheusAccess, timeout: float) -> PrometheusConnect:
    if not url.startswith(("http://", "https://")):
        raise DiagnoseError(f"--prometheus: {url!r} is not an http:// or https:// URL")
    return access.client(url, timeout)


def _ask(url: str, call: Any, promql: str, access: PrometheusAccess) -> Any:
    try:
        return call()
    except (RequestException, PrometheusApiClientException, ValueError) as error:
        raise DiagnoseError(access.failure(url, promql, error)) from None


def _instant(value: list[dict[str, Any]]) -> float | None:
    if not value:
        return None
    number = float(value[0]["value"][1])
    return number if math.isfinite(number) else None


def run(args: argparse.Namespace, now: float) -> dict[str, Any]:
    """Query, decide, advise: the report as a JSON-ready dict."""
    since = _seconds("--since", args.since)
    step = _seconds("--step", args.step) if args.step else max(15.0, since / 120)
    window = _seconds("--window", args.window) if args.window else 2 * step
    timeout = _seconds("--timeout", args.timeout)
    if since / step > MAX_POINTS:
        raise DiagnoseError(f"--step: {since / step:.0f} steps in --since; at most {MAX_POINTS}")
    if step > since:
        raise DiagnoseError("--step: longer than --since")
    slo, backend, facts, source = _settings(args)
    try:
        access = from_args(args)
    except AccessError as error:
        raise DiagnoseError(str(error)) from None
    client = _client(args.prometheus, access, timeout)
    start, end = datetime.fromtimestamp(now - since, UTC), datetime.fromtimestamp(now, UTC)
    answers: dict[Series, Any] = {}
    for series, promql in range_queries(backend, args.namespace, args.model, window).items():
        answers[series] = _ask(
            args.prometheus,
            lambda q=promql: client.custom_query_range(
                q, start, end, prometheus_duration(step), timeout=timeout
            ),
            promql,
            access,
        )
    line = timeline(by_role(answers))
    finding = diagnose(line, slo)
    traffic = Traffic()
    if line is not None:
        queries = traffic_queries(backend, args.namespace, args.model, line.decoding_role, since)
        values = {
            key: _instant(
                _ask(
                    args.prometheus,
                    lambda q=q: client.custom_query(q, timeout=timeout),
                    q,
                    access,
                )
            )
            for key, q in queries.items()
        }
        traffic = Traffic(
            values.get("rate"), values.get("meanPrompt"), values.get("p50Prompt"),
            values.get("p90Prompt"),
            values.get("p99Prompt"), values.get("meanOutput"),
        )  # fmt: skip
    step_advice: NextStep = next_step(finding, line, slo, facts, traffic)
    context = {
        "model": args.model, "namespace": args.namespace, "prometheus": args.prometheus,
        "start": start.isoformat(timespec="seconds"), "end": end.isoformat(timespec="seconds"),
        "stepSeconds": step, "windowSeconds": window, "backend": backend,
        "settingsFrom": source,
    }  # fmt: skip
    return to_json(context, line, finding, slo, traffic, step_advice)
