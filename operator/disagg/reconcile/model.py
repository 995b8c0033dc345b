"""One level-based pass over one model, the operator's only control loop.

    read the model -> validate -> its children and pods (from the watch cache)
      -> an autoscaler evaluation, if one is due: Prometheus -> the pure policy -> replicas
      -> render (pool replicas: the decision, else the live size, else the spec's)
      -> apply what differs -> prune what is unwanted -> observe pods
      -> compute the status -> one status write -> requeue when the next evaluation is due

A status write waits (up to ``OBSERVE_WAIT_SECONDS``) while a Deployment's controller has not
yet observed what the pass changed: the rollout state it would report is the one the next
watch event replaces, so writing it costs a second write for no news. A pool at zero
replicas that runs none is not waited for: its rollout has nothing to do.

The same pass runs for create, update, a child's change, the periodic resync and the
autoscaler's interval (a requeue-after on the work queue); it never branches on which event
fired. It is the one writer of pool replicas (rendered into the Deployments it applies) and
of the model's status (:meth:`Reconciler._write_status`). It writes only what differs (see
:mod:`disagg.drift`), so an unchanged model costs reads and no writes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Final

from disagg.api.autoscaling import DEFAULT_PROMETHEUS_URL
from disagg.api.base import parse_duration
from disagg.api.resource import DisaggregatedModel, ManifestError, parse_model
from disagg.api.spec import Role
from disagg.api.status import DisaggregatedModelStatus
from disagg.autoscale.recall import remembered
from disagg.clock import Clock, rfc3339, system_clock
from disagg.kube.client import KubeClient, KubeError
from disagg.kube.events import EventRecorder
from disagg.kube.informer import ChildCache
from disagg.kube.models import ModelStore
from disagg.naming import ROLE_LABEL, ComponentRole, child_name
from disagg.reconcile.children import Live, apply_children, prune
from disagg.reconcile.evaluate import (
    Evaluation,
    ScalerState,
    SloReport,
    SourceFactory,
    evaluate,
    evaluation_events,
    mark_cheapest,
    recalled_state,
    scaling_record,
)
from disagg.reconcile.prometheus import PrometheusSources
from disagg.render import RenderContext, render_all, router_endpoint
from disagg.rollout import unobserved
from disagg.status import (
    MEMORY_KEY,
    Observed,
    ObservedRoute,
    ScalingRecord,
    compute_status,
    invalid_status,
    memory_age,
    previous_status,
    route_events,
    status_patch,
    worth_writing,
)
from disagg.transition import POOL_ROLES, mode_roles, plan_switch, starting_sizes
from disagg.versions import DEFAULT_IMAGES, DataPlaneImages

log = logging.getLogger("disagg.reconcile")
Obj = dict[str, Any]
Key = tuple[str, str]
REJECTED: Final = frozenset({400, 403, 404, 405, 413, 415, 422})
"""Statuses that refuse the request itself: applying it again gets the same answer."""
OBSERVE_WAIT_SECONDS: Final = 5.0
"""How long a status write waits for the Deployment controller to observe a change."""


@dataclass(frozen=True)
class Outcome:
    """What a pass did: counts for logs and metrics, and when to come back."""

    applied: int = 0
    pruned: int = 0
    status_written: bool = False
    invalid: bool = False
    gone: bool = False
    conflict: bool = False
    """The model changed while the pass ran: run again now, against the new version."""
    requeue_after: float | None = None
    """Seconds until the next autoscaler evaluation is due, or the status write's wait ends."""
    status_waiting: bool = False
    """The status write waits for the Deployment controller (see OBSERVE_WAIT_SECONDS)."""
    budgeted: bool | None = None
    """Whether the built-in autoscaler counts this model's SLOs (its metrics are exported);
    None when the pass ended before it could say (a refused apply keeps them)."""
    slo: SloReport | None = None
    """This pass's evaluation, as the operator's metrics export it (None: none was due)."""


INSTALL: Final = {
    "HTTPRoute": "the Gateway API CRDs (gateway.networking.k8s.io, standard channel)",
    "InferencePool": "the Gateway API Inference Extension's CRDs (InferencePool v1 and "
    "InferenceObjective, v1.2.0 or later)",
}
"""What a cluster lacking each route kind's API needs installed."""


def _unserved(routes: list[Obj]) -> str | None:
    """Why routes could not be created: the cluster does not serve their API."""
    if not routes:
        return None
    kinds = sorted({(o["kind"], o["apiVersion"]) for o in routes})
    served = ", ".join(f"{version} {kind}" for kind, version in kinds)
    needed = " and ".join(INSTALL[kind] for kind, _ in kinds)
    return (
        f"the cluster does not serve {served}: install {needed}; the model's engines run meanwhile"
    )


def _route(model: DisaggregatedModel, live: Live, problem: str | None) -> ObservedRoute | None:
    """What the model's HTTPRoute is (live, with its Gateways' verdicts), when it wants one."""
    gateway = model.spec.gateway
    if gateway is None or not model.spec.router.enabled:
        return None
    name = child_name(model.metadata.name, "router")
    return ObservedRoute(
        name=name,
        parents=tuple(
            (ref.namespace or model.metadata.namespace, ref.name, ref.section_name)
            for ref in gateway.parent_refs
        ),
        live=live.get(("HTTPRoute", name)),
        unavailable=problem,
    )


def _already_degraded(
    previous: DisaggregatedModelStatus | None,
    reason: str,
    generation: int,
    message: str | None = None,
) -> bool:
    """Whether status already says so for this generation (then its Event was posted)."""
    return previous is not None and any(
        c.type == "Degraded"
        and c.reason == reason
        and c.observed_generation == generation
        and (message is None or c.message == message)
        for c in previous.conditions
    )


def _terminating(pods: list[Obj], role: str) -> int:
    """How many of ``role``'s pods are shutting down (still serving what they hold)."""
    return sum(
        1
        for pod in pods
        if pod["metadata"].get("deletionTimestamp")
        and pod["metadata"].get("labels", {}).get(ROLE_LABEL) == role
    )


def _pool_children(name: str, roles: tuple[Role, ...]) -> frozenset[Key]:
    """The Deployment, Service and PodDisruptionBudget of each of ``roles``' pools."""
    return frozenset(
        (kind, child_name(name, role))
        for role in roles
        for kind in ("Deployment", "Service", "PodDisruptionBudget")
    )


def _builtin(model: DisaggregatedModel) -> bool:
    a = model.spec.autoscaling
    return a.enabled and a.mode == "builtin"


@dataclass
class Reconciler:
    """The pass, with what it needs from outside: the API server, what the watches last
    delivered of the models and of their children, Prometheus, the clock."""

    client: KubeClient
    recorder: EventRecorder
    cache: ChildCache
    models: ModelStore
    clock: Clock = system_clock
    prometheus: SourceFactory = field(default_factory=PrometheusSources)
    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    """Where a model that names no Prometheus is read from (KEDA's triggers too)."""
    images: DataPlaneImages = DEFAULT_IMAGES
    """The engine and router images of a model that names none."""
    scalers: dict[Key, ScalerState] = field(default_factory=dict)
    """Each autoscaled model's policy memory (the leader's; dropped when leadership is)."""
    waiting_since: dict[Key, float] = field(default_factory=dict)
    """When each model's status write began waiting for the Deployment controller."""

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        """Bring one model's children and status in line with its spec."""
        body = await self.models.get(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.scalers.pop((namespace, name), None)
            self.waiting_since.pop((namespace, name), None)
            return Outcome(gone=True)  # ownerReferences let the garbage collector remove children
        now = self.clock()
        generation = int(body["metadata"].get("generation", 0))
        previous = previous_status(body.get("status"))
        try:
            model = parse_model(body)
        except ManifestError as error:
            status = invalid_status(error.problems, generation, previous, rfc3339(now))
            if not _already_degraded(previous, "InvalidSpec", generation):
                await self.recorder.warning(body, "InvalidSpec", "; ".join(error.problems))
            return await self._write_status(body, status, Outcome(invalid=True), keep_memory=True)

        live = self.cache.children(namespace, name)
        pods = self.cache.pods(namespace, name)
        switch = plan_switch(
            model.spec.mode,
            self._deployments(name, live),
            model.spec.router.enabled,
            _terminating(pods, "router"),
        )
        evaluation = await self._evaluate(model, body, live, now)
        replicas = self._replicas(live, evaluation)
        replicas = {**starting_sizes(model.spec, switch.retiring, replicas), **replicas}
        ctx = RenderContext(
            model, replicas=replicas, router_mode=switch.router_mode,
            prometheus_url=self.prometheus_url, images=self.images,
        )  # fmt: skip
        desired = render_all(ctx)
        unserved: list[Obj] = []
        try:
            applied = await apply_children(
                self.client, self.cache, desired, live, self.recorder, body, unserved
            )
        except KubeError as error:
            return await self._refused(body, previous, generation, now, error)
        pruned = await prune(
            self.client, self.cache, body["metadata"]["uid"], desired, live, self.recorder, body,
            kept=_pool_children(name, switch.retiring),
        )  # fmt: skip
        observed = Observed(
            generation=generation,
            deployments=self._deployments(name, live),
            roles=(*model.spec.roles, *switch.retiring),
            serving=mode_roles(switch.router_mode),
            switching=switch.message,
            pods=pods,
            router_enabled=model.spec.router.enabled,
            router_endpoint=router_endpoint(ctx),
            autoscaling_enabled=model.spec.autoscaling.enabled,
            autoscaling_mode=model.spec.autoscaling.mode,
            route=_route(model, live, _unserved(unserved)),
            scaling=self._record(model, evaluation),
            memory=state.saved if (state := self.scalers.get((namespace, name))) else None,
        )
        status = compute_status(observed, previous, rfc3339(now))
        degraded = next(c for c in status.conditions if c.type == "Degraded")
        if degraded.status == "True" and not _already_degraded(
            previous, degraded.reason, generation
        ):
            await self.recorder.warning(body, degraded.reason, degraded.message)
        for event in route_events(previous, status):
            await self._post(body, event)
        if evaluation is not None:
            written = body.get("status") or {}
            before = written.get("conditions") or []
            for event in evaluation_events(evaluation, before, written.get("sloBudget")):
                await self._post(body, event)
        outcome = Outcome(
            applied=applied, pruned=pruned, requeue_after=self._next(model, now),
            budgeted=_builtin(model), slo=evaluation.report() if evaluation else None,
        )  # fmt: skip
        wait = self._observe_wait((namespace, name), observed, degraded.status, now)
        if wait is not None:
            due = min(wait, outcome.requeue_after or wait)
            return replace(outcome, requeue_after=due, status_waiting=True)
        self.waiting_since.pop((namespace, name), None)
        state = self.scalers.get((namespace, name))
        unreadable = state is not None and state.unreadable
        outcome = await self._write_status(body, status, outcome, rewrite_memory=unreadable)
        if state is not None and not outcome.conflict:
            state.pending = None  # the evaluation is in status now
            state.unreadable = unreadable and not outcome.status_written
        return outcome

    async def _evaluate(
        self, model: DisaggregatedModel, body: Obj, live: Live, now: float
    ) -> Evaluation | None:
        """An autoscaler evaluation when one is due and both pools exist, else None."""
        key = (model.metadata.namespace, model.metadata.name)
        if not _builtin(model):
            self.scalers.pop(key, None)
            return None
        state = self.scalers.get(key) or await self._recall(model, body, now)
        if state.mode != model.spec.mode:
            # What one pool shape taught (a colocated engine's prefill speed, say) does not
            # hold for the other mode's pools: learn again.
            state = self.scalers[key] = ScalerState(mode=model.spec.mode)
        roles = model.spec.roles
        deployments = {
            role: pool
            for role in roles
            if (pool := live.get(("Deployment", child_name(model.metadata.name, role))))
        }
        if now < state.next_evaluation or len(deployments) < len(roles):
            return None
        source = self.prometheus(model.spec.autoscaling.prometheus_url)
        status = body.get("status") or {}
        evaluation = await evaluate(model, source, deployments, status, state, now, self.images)
        if evaluation.unavailable is None or evaluation.relearning:
            state.saved = remembered(state.memories, state.mode, now)
        for decision in evaluation.resized():
            if decision.desired < decision.current:
                await mark_cheapest(self.client, model, decision.pool, source)
            log.info(
                "%s/%s %s %d -> %d: %s", key[0], key[1], decision.pool,
                decision.current, decision.desired, decision.reason,
            )  # fmt: skip
        return evaluation

    async def _recall(self, model: DisaggregatedModel, body: Obj, now: float) -> ScalerState:
        """A model's autoscaler state as status kept it (after a restart, or on a new
        leader), else a fresh one; what cannot be read is said once, in an Event."""
        state, problems = recalled_state((body.get("status") or {}).get(MEMORY_KEY), model, now)
        if problems:
            message = "learning again: " + "; ".join(problems)
            log.warning("%s autoscaler memory unreadable, %s", model.metadata.name, message)
            await self.recorder.warning(body, "AutoscalerMemoryUnreadable", message)
        self.scalers[model.metadata.namespace, model.metadata.name] = state
        return state

    def _observe_wait(
        self,
        key: Key,
        observed: Observed,
        degraded: str,
        now: float,
    ) -> float | None:
        """Seconds the status write may still wait for the Deployment controller, or None to
        write now: a refusal or a failure is news at once, and a wait ends after
        OBSERVE_WAIT_SECONDS whatever the controller does (it may be down). A scaling
        decision waits too: it is kept until a status write records it, and its Event is
        posted at once."""
        if degraded == "True":
            return None
        if not any(unobserved(d) for d in observed.deployments.values() if d is not None):
            return None
        left = self.waiting_since.setdefault(key, now) + OBSERVE_WAIT_SECONDS - now
        return left if left > 0 else None

    def _record(
        self, model: DisaggregatedModel, evaluation: Evaluation | None
    ) -> ScalingRecord | None:
        """This pass's evaluation for status, or one a failed status write has not recorded
        yet (kept until a write succeeds, so no resize goes missing from status)."""
        state = self.scalers.get((model.metadata.namespace, model.metadata.name))
        if state is None:
            return None
        if evaluation is not None:
            state.pending = scaling_record(evaluation)
        return state.pending

    @staticmethod
    def _deployments(name: str, live: Live) -> dict[str, Obj | None]:
        """The live pool and router Deployments by role (None when absent)."""
        roles: tuple[ComponentRole, ...] = (*POOL_ROLES, "router")
        return {role: live.get(("Deployment", child_name(name, role))) for role in roles}

    @staticmethod
    def _replicas(live: Live, evaluation: Evaluation | None) -> dict[str, int]:
        """Pool sizes to render: the evaluation's decision, else what the pool runs now."""
        replicas: dict[str, int] = {}
        for (kind, _), obj in live.items():
            role = obj["metadata"].get("labels", {}).get(ROLE_LABEL)
            if kind == "Deployment" and role in POOL_ROLES and "replicas" in obj.get("spec", {}):
                replicas[role] = int(obj["spec"]["replicas"])
        return {**replicas, **(evaluation.replicas() if evaluation else {})}

    def _next(self, model: DisaggregatedModel, now: float) -> float | None:
        """Seconds until the next evaluation, set once the pass got this far: a pass that
        failed before applying a decision evaluates again on its retry."""
        state = self.scalers.get((model.metadata.namespace, model.metadata.name))
        if state is None:
            return None
        interval = parse_duration(model.spec.autoscaling.interval)
        if state.next_evaluation <= now:
            state.next_evaluation = now + interval
        return state.next_evaluation - now

    async def _refused(
        self,
        body: Obj,
        previous: DisaggregatedModelStatus | None,
        generation: int,
        now: float,
        error: KubeError,
    ) -> Outcome:
        if error.status == 403 and "being terminated" in error.message:
            return Outcome(gone=True)  # the namespace is going away, and the model with it
        if error.status not in REJECTED:
            await self.recorder.warning(body, "ApplyFailed", str(error))
            raise error  # transient: the queue retries with backoff
        # Refused (invalid, forbidden by admission or a policy, an API not installed): the
        # same apply gets the same answer, so say why once; resyncs try again, and the model
        # recovers by itself when the cause goes away.
        message = f"the API server refused {error.message}"
        status = invalid_status([message], generation, previous, rfc3339(now), "ApplyRejected")
        if not _already_degraded(previous, "ApplyRejected", generation, message):
            await self.recorder.warning(body, "ApplyRejected", message)
        return await self._write_status(body, status, Outcome(invalid=True), keep_memory=True)

    async def _post(self, body: Obj, event: Obj) -> None:
        post = self.recorder.warning if event["type"] == "Warning" else self.recorder.normal
        await post(body, event["reason"], event["message"])

    async def _write_status(
        self,
        body: Obj,
        status: DisaggregatedModelStatus,
        outcome: Outcome,
        *,
        keep_memory: bool = False,
        rewrite_memory: bool = False,
    ) -> Outcome:
        """The one write of a model's status, only if it changed, and only over the version
        this pass read (a 409 means the model moved on: the pass runs again). A pass that
        ran no autoscaler (``keep_memory``: a spec it refused) leaves its memory as it is;
        ``rewrite_memory`` replaces one that could not be read back at once."""
        meta = body["metadata"]
        old = body.get("status") or {}
        new = status.to_wire()
        if keep_memory and MEMORY_KEY in old:
            new[MEMORY_KEY] = old[MEMORY_KEY]
        patch = status_patch(old, new)
        age = None if rewrite_memory else memory_age(old, self.clock())
        if not worth_writing(patch, age):
            return outcome
        try:
            with self.models.writing(meta["namespace"], meta["name"]):
                written = await self.client.patch_status(
                    "DisaggregatedModel", meta["namespace"], meta["name"], patch,  # type: ignore[arg-type]
                    resource_version=meta.get("resourceVersion"),
                )  # fmt: skip
                self.models.record(written)
        except KubeError as error:
            if error.status == 404:
                self.models.drop(meta["namespace"], meta["name"])
                return replace(outcome, gone=True)
            if error.status != 409:
                raise
            self.models.drop(meta["namespace"], meta["name"])  # read it afresh next pass
            return replace(outcome, conflict=True)
        return replace(outcome, status_written=True)
