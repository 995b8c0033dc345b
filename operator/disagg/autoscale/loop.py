"""The per-model autoscaler loop: read Prometheus, run the policy, act, record.

It is the single writer of pool replicas while ``spec.autoscaling`` is on (builtin mode): it
server-side applies only ``spec.replicas`` of the pool Deployments under its own field
manager, never the model's spec, so GitOps tools see no drift. Every decision lands in
status (desired replicas, last scale time and reason, the observed p99s) and as an Event.
Nothing it needs for correctness lives only in memory: replicas are read from the
Deployments and the last scale time from status on every tick.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from disagg.api.base import format_duration, parse_duration
from disagg.api.resource import DisaggregatedModel, ManifestError, parse_model
from disagg.autoscale.metrics import MetricsUnavailable, PrometheusSource
from disagg.autoscale.policy import (
    UNREACHABLE_MARK,
    Behavior,
    Decision,
    PoolMemory,
    PoolName,
    PoolPolicy,
    Signals,
    apply_budget,
    decide_pool,
)
from disagg.autoscale.queries import build_queries, pool_selector
from disagg.kube.client import KubeClient, KubeError
from disagg.kube.events import EventRecorder
from disagg.naming import child_name

log = logging.getLogger("disagg.autoscaler")
AUTOSCALER_MANAGER: Final = "disagg-autoscaler"
DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
POOLS: Final[tuple[PoolName, ...]] = ("prefill", "decode")
Obj = dict[str, Any]


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def replicas_object(namespace: str, name: str, replicas: int) -> Obj:
    """The only fields the autoscaler ever applies to a Deployment."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas},
    }


def pool_policies(model: DisaggregatedModel) -> dict[PoolName, PoolPolicy]:
    spec = model.spec
    slos = {
        "prefill": parse_duration(spec.autoscaling.ttft_p99),
        "decode": parse_duration(spec.autoscaling.tpot_p99),
    }
    return {
        role: PoolPolicy(
            slo=slos[role],
            min_replicas=spec.pool(role).autoscaling.min_replicas,
            max_replicas=spec.pool(role).autoscaling.max_replicas,
            gpus_per_replica=spec.pool(role).gpus,
            max_num_seqs=spec.pool(role).max_num_seqs,
            tensor_parallel=spec.pool(role).tensor_parallel_size,
        )
        for role in POOLS
    }


def behavior(model: DisaggregatedModel) -> Behavior:
    a = model.spec.autoscaling
    return Behavior(
        up_window=parse_duration(a.scale_up.stabilization_window),
        up_step=a.scale_up.max_step,
        up_cooldown=parse_duration(a.scale_up.cooldown),
        down_window=parse_duration(a.scale_down.stabilization_window),
        down_step=a.scale_down.max_step,
        down_cooldown=parse_duration(a.scale_down.cooldown),
        stale_after=max(30.0, 3 * parse_duration(a.interval)),
        window=parse_duration(a.window),
    )


def _condition(
    type_: str, status: str, reason: str, message: str, generation: int, previous: list[Obj]
) -> Obj:
    before = next((c for c in previous if c.get("type") == type_), None)
    moved = before is None or before.get("status") != status
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": _now_iso() if moved else before["lastTransitionTime"],  # type: ignore[index]
        "observedGeneration": generation,
    }


def apply_merge_patch(target: Obj, patch: Obj) -> Obj:
    """The result of a JSON merge patch (RFC 7386) on ``target`` (pure)."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = apply_merge_patch(result[key], value)
        else:
            result[key] = value
    return result


def _without_timestamp(status: Obj) -> Obj:
    metrics = {k: v for k, v in (status.get("metrics") or {}).items() if k != "observedAt"}
    return {**status, "metrics": metrics}


def merge_conditions(previous: list[Obj], updates: list[Obj]) -> list[Obj]:
    """Replace the autoscaler's conditions, keep the reconciler's (pure)."""
    replaced = {c["type"] for c in updates}
    return [c for c in previous if c.get("type") not in replaced] + updates


@dataclass
class ModelAutoscaler:
    """Scales one model's pools every ``spec.autoscaling.interval`` until it is told to stop."""

    client: KubeClient
    recorder: EventRecorder
    namespace: str
    name: str
    on_change: Callable[[], None]
    source_factory: Callable[[str], PrometheusSource] = PrometheusSource
    clock: Callable[[], float] = time.time
    memories: dict[str, PoolMemory] = field(
        default_factory=lambda: {p: PoolMemory() for p in POOLS}
    )

    async def run(self) -> None:
        while True:
            try:
                interval = await self.tick()
            except asyncio.CancelledError:
                raise
            except (KubeError, OSError) as error:
                log.warning(
                    "Autoscaler tick failed for %s/%s: %s", self.namespace, self.name, error
                )
                await self._record_failure(str(error))
                interval = 5.0
            if interval is None:
                return
            await asyncio.sleep(interval)

    async def _signals(
        self, model: DisaggregatedModel, source: PrometheusSource
    ) -> dict[PoolName, Signals]:
        a = model.spec.autoscaling
        overrides = a.queries.model_dump(by_alias=True, exclude_none=True) if a.queries else {}
        result: dict[PoolName, Signals] = {}
        for role in POOLS:
            queries = build_queries(
                model.spec.engine.backend,
                self.namespace,
                self.name,
                role,
                parse_duration(a.window),
                overrides,
            )
            result[role] = await source.signals(
                queries, "ttftP99" if role == "prefill" else "tpotP99"
            )
        return result

    async def tick(self) -> float | None:
        """One evaluation; returns seconds until the next, or None to stop."""
        body = await self.client.get("DisaggregatedModel", self.namespace, self.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        try:
            model = parse_model(body)
        except ManifestError:
            return 15.0  # the reconciler reports the invalid spec; replicas stay as they are
        a = model.spec.autoscaling
        if not a.enabled or a.mode != "builtin":
            return None
        interval = parse_duration(a.interval)
        deployments = {
            role: await self.client.get("Deployment", self.namespace, child_name(self.name, role))
            for role in POOLS
        }
        if any(d is None for d in deployments.values()):
            return interval
        status = body.get("status") or {}
        generation = int(body["metadata"].get("generation", 0))
        source = self.source_factory(a.prometheus_url)
        try:
            signals = await self._signals(model, source)
        except MetricsUnavailable as error:
            await self._record_unavailable(body, str(error), generation)
            return interval
        now = self.clock()
        policies = pool_policies(model)
        rules = behavior(model)
        decisions = []
        for role in POOLS:
            dep = deployments[role] or {}
            current = int(dep.get("spec", {}).get("replicas", 1))
            ready = int(dep.get("status", {}).get("readyReplicas", 0))
            last = _epoch((status.get(role) or {}).get("lastScaleTime"))
            decisions.append(
                decide_pool(
                    role,
                    signals[role],
                    current,
                    ready,
                    policies[role],
                    rules,
                    self.memories[role],
                    last,
                    now,
                )
            )
        decisions = apply_budget(decisions, policies, a.max_total_gpus)
        await self._act(body, model, decisions, signals, source, generation)
        return interval

    async def _act(
        self,
        body: Obj,
        model: DisaggregatedModel,
        decisions: list[Decision],
        signals: dict[PoolName, Signals],
        source: PrometheusSource,
        generation: int,
    ) -> None:
        status = body.get("status") or {}
        patch: Obj = {}
        changed = False
        for decision in decisions:
            pool_patch: Obj = {}
            if decision.desired != decision.current:
                name = child_name(self.name, decision.pool)
                if decision.desired < decision.current:
                    await self._mark_cheapest(model, decision, source)
                await self.client.apply(
                    replicas_object(self.namespace, name, decision.desired),
                    manager=AUTOSCALER_MANAGER,
                )
                pool_patch = {
                    "desiredReplicas": decision.desired,
                    "lastScaleTime": _now_iso(),
                    "lastScaleReason": decision.reason,
                }
                verb = "ScaledUp" if decision.desired > decision.current else "ScaledDown"
                await self.recorder.normal(
                    body,
                    verb,
                    f"{decision.pool} {decision.current} -> {decision.desired}: {decision.reason}",
                )
                log.info(
                    "%s/%s %s %d -> %d: %s",
                    self.namespace,
                    self.name,
                    decision.pool,
                    decision.current,
                    decision.desired,
                    decision.reason,
                )
                changed = True
            if pool_patch:
                patch[decision.pool] = pool_patch
        prefill, decode = signals["prefill"], signals["decode"]
        metrics: Obj = {"observedAt": _now_iso()}
        for key, value in (("ttftP99", prefill.p99), ("tpotP99", decode.p99)):
            metrics[key] = format_duration(value) if value is not None else None
            metrics[key + "Seconds"] = round(value, 6) if value is not None else None
        metrics["requestRate"] = (
            round(decode.request_rate, 4) if decode.request_rate is not None else None
        )
        patch["metrics"] = metrics
        summary = "; ".join(f"{d.pool}: {d.reason}" for d in decisions)
        limited = [d.reason for d in decisions if d.limited]
        unreachable = [f"{d.pool}: {d.unreachable}" for d in decisions if d.unreachable]
        previous = status.get("conditions") or []
        reason = "GpuBudget" if limited else "SLOUnreachable" if unreachable else "WithinLimits"
        patch["conditions"] = merge_conditions(
            previous,
            [
                _condition("ScalingActive", "True", "SLOTracking", summary, generation, previous),
                _condition(
                    "ScalingLimited",
                    "True" if limited or unreachable else "False",
                    reason,
                    "; ".join(limited + unreachable),
                    generation,
                    previous,
                ),
            ],
        )
        before: Obj = next((c for c in previous if c.get("type") == "ScalingLimited"), {})
        if unreachable and UNREACHABLE_MARK not in str(before.get("message", "")):
            await self.recorder.warning(body, "SLOUnreachable", "; ".join(unreachable))
        await self._patch_status(body, patch)
        if changed:
            self.on_change()

    async def _record_unavailable(self, body: Obj, message: str, generation: int) -> None:
        previous = (body.get("status") or {}).get("conditions") or []
        conditions = merge_conditions(
            previous,
            [
                _condition(
                    "ScalingActive",
                    "False",
                    "MetricsUnavailable",
                    f"holding replicas: {message}",
                    generation,
                    previous,
                )
            ],
        )
        already: Obj = next((c for c in previous if c.get("type") == "ScalingActive"), {})
        if already.get("reason") != "MetricsUnavailable":
            await self.recorder.warning(body, "MetricsUnavailable", f"holding replicas: {message}")
        await self._patch_status(body, {"conditions": conditions})

    async def _record_failure(self, message: str) -> None:
        """Say in status why the autoscaler cannot act (best effort: the API may be the cause)."""
        try:
            body = await self.client.get("DisaggregatedModel", self.namespace, self.name)
            if body is None:
                return
            previous = (body.get("status") or {}).get("conditions") or []
            generation = int(body["metadata"].get("generation", 0))
            failure = _condition(
                "ScalingActive",
                "False",
                "AutoscalerError",
                f"holding replicas: {message}",
                generation,
                previous,
            )
            await self._patch_status(body, {"conditions": merge_conditions(previous, [failure])})
        except (KubeError, OSError) as error:
            log.debug("Could not record the autoscaler failure: %s", error)

    async def _patch_status(self, body: Obj, patch: Obj) -> None:
        current = body.get("status") or {}
        if _without_timestamp(apply_merge_patch(current, patch)) == _without_timestamp(current):
            return  # nothing but the sample time would change: an unchanged model costs no write
        try:
            await self.client.patch_status(
                "DisaggregatedModel",
                self.namespace,
                self.name,
                patch,
                resource_version=body["metadata"].get("resourceVersion"),
            )
        except KubeError as error:
            if error.status != 409:  # someone wrote in between: the next tick recomputes
                raise

    async def _mark_cheapest(
        self, model: DisaggregatedModel, decision: Decision, source: PrometheusSource
    ) -> None:
        """Give the least-loaded pods the lowest deletion cost, so the ReplicaSet removes them."""
        names = (
            "vllm:num_requests_running"
            if model.spec.engine.backend == "vllm"
            else "sglang:num_running_reqs"
        )
        selector = pool_selector(self.namespace, self.name, decision.pool)
        try:
            per_pod = await source.vector(f"sum by (pod) ({names}{{{selector}}})")
        except MetricsUnavailable:
            return
        for pod, running in per_pod.items():
            cost = str(int(min(running, 1_000_000)))
            try:
                await self.client.patch(
                    "Pod", self.namespace, pod, {"metadata": {"annotations": {DELETION_COST: cost}}}
                )
            except KubeError as error:
                log.info("Pod %s/%s not annotated: %s", self.namespace, pod, error)
