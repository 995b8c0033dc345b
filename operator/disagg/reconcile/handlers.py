"""Thin wiring: watch events only enqueue work; the queue runs one code path per model.

kopf watches the models with a raw watch handler (``kopf.on.event``), so it keeps no
bookkeeping of its own on them: no finalizers, no last-handled annotations, nothing written
that a GitOps tool would see as drift. The children and their pods are followed by the
operator's own :class:`~disagg.kube.informer.ChildCache`, which passes read instead of
listing, and whose changes enqueue the model they belong to. Deleted models are cleaned up
by the garbage collector through ownerReferences.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web

from disagg.kube.client import KubeClient
from disagg.kube.credentials import load_credentials
from disagg.kube.events import EventRecorder
from disagg.kube.informer import ChildCache
from disagg.kube.models import ModelStore
from disagg.reconcile.children import OPTIONAL_KINDS, WAKE_VIEWS, WATCHED_KINDS
from disagg.reconcile.config import RunConfig
from disagg.reconcile.leader import LeaderElector
from disagg.reconcile.metrics import OperatorMetrics, serve
from disagg.reconcile.model import Reconciler
from disagg.reconcile.prometheus import PrometheusSources
from disagg.reconcile.queue import Key, WorkQueue

log = logging.getLogger("disagg.operator")
SYNC_WAIT_SECONDS = 10.0


@dataclass
class Runtime:
    """Everything the handlers share, created at startup and closed at cleanup."""

    config: RunConfig
    client: KubeClient
    cache: ChildCache
    reconciler: Reconciler
    metrics: OperatorMetrics
    queue: WorkQueue | None = None
    elector: LeaderElector | None = None
    server: web.AppRunner | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    ready: bool = False

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def enqueue(self, key: Key) -> None:
        if self.queue is not None and self.leading:
            self.queue.add(key)
            self.metrics.queue.set(self.queue.pending())

    def lose_leadership(self) -> None:
        """Forget what only the leader may act on: scheduled evaluations, policy memory."""
        if self.queue is not None:
            self.queue.forget_timers()
        self.reconciler.scalers.clear()

    async def enqueue_all(self) -> None:
        await self.cache.synced()  # a pass before it would take every child for missing
        scopes: tuple[str | None, ...] = self.config.namespaces or (None,)
        for namespace in scopes:
            for model in await self.client.list_objects("DisaggregatedModel", namespace):
                self.reconciler.models.seen(None, model)
                self.enqueue((model["metadata"]["namespace"], model["metadata"]["name"]))


async def _work(runtime: Runtime, key: Key) -> None:
    namespace, name = key
    # The models' watch may deliver them before the children's are listed: wait a little for
    # those lists, then let the pass fail (and count) with the reason they are missing.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(runtime.cache.synced(), SYNC_WAIT_SECONDS)
    with runtime.metrics.duration.time():
        try:
            outcome = await runtime.reconciler.reconcile(namespace, name)
        except Exception:
            runtime.metrics.reconciles.labels(result="error").inc()
            raise
    if outcome.conflict:
        runtime.enqueue(key)  # the model changed under the pass: again, against the new one
    elif outcome.requeue_after is not None and runtime.queue is not None and runtime.leading:
        runtime.queue.add_after(key, outcome.requeue_after)
    result = (
        "invalid" if outcome.invalid else "gone" if outcome.gone
        else "conflict" if outcome.conflict else "ok"
    )  # fmt: skip
    runtime.metrics.reconciles.labels(result=result).inc()
    if outcome.slo is not None:
        runtime.metrics.observe_slo(namespace, name, outcome.slo)
    elif outcome.gone or outcome.invalid or outcome.budgeted is False:
        runtime.metrics.forget_slo(namespace, name)
    if outcome.applied or outcome.pruned:
        log.info(
            "Reconciled DisaggregatedModel %s/%s applied=%d pruned=%d",
            namespace,
            name,
            outcome.applied,
            outcome.pruned,
        )


async def _resync_forever(runtime: Runtime) -> None:
    while True:
        await asyncio.sleep(runtime.config.resync_seconds)
        try:
            await runtime.enqueue_all()
        except Exception as error:  # a failed listing must not end the resync loop
            log.warning("Resync listing failed: %s", error)


def register(registry: kopf.OperatorRegistry, config: RunConfig) -> None:
    """Register every handler of the operator on ``registry``."""

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        # The same credentials as our own client, so kopf's watches and our writes agree.
        creds = await asyncio.to_thread(load_credentials, config.kubeconfig)
        return kopf.ConnectionInfo(
            server=creds.host,
            ca_path=creds.ca_file,
            insecure=not creds.verify,
            token=creds.token,
            certificate_path=creds.cert_file,
            private_key_path=creds.key_file,
            expiration=None,
        )

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.posting.enabled = False  # we post our own, meaningful Events
        settings.scanning.disabled = True  # no CRD/namespace scanning: less RBAC
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        metrics = OperatorMetrics()
        client = await KubeClient.connect(config.kubeconfig, on_write=metrics.count_write)

        def wake(namespace: str, model: str) -> None:
            runtime.enqueue((namespace, model))

        cache = ChildCache(
            client,
            WATCHED_KINDS,
            wake,
            namespaces=config.namespaces or (None,),
            optional=OPTIONAL_KINDS,
            views=WAKE_VIEWS,
        )
        models = ModelStore(client, on_change=wake)
        runtime = Runtime(
            config=config,
            client=client,
            cache=cache,
            reconciler=Reconciler(
                client,
                EventRecorder(client),
                cache,
                models,
                prometheus=PrometheusSources(config.prometheus),
                prometheus_url=config.prometheus.default_url,
                images=config.images,
            ),
            metrics=metrics,
        )
        runtime.tasks.append(asyncio.create_task(cache.run(), name="child watches"))
        runtime.queue = WorkQueue(lambda key: _work(runtime, key), concurrency=config.concurrency)

        def on_leadership(leading: bool) -> None:
            metrics.leader.set(1 if leading else 0)
            if leading:
                runtime.tasks.append(asyncio.create_task(runtime.enqueue_all()))
            else:
                runtime.lose_leadership()

        if config.leader_election:
            runtime.elector = LeaderElector(
                client, config.lease_namespace, config.lease_name, on_leadership
            )
            runtime.tasks.append(asyncio.create_task(runtime.elector.run(), name="leader election"))
        else:
            metrics.leader.set(1)
        runtime.tasks.append(asyncio.create_task(_resync_forever(runtime), name="resync"))
        runtime.server = await serve(
            metrics, config.metrics_host, config.metrics_port, lambda: runtime.ready
        )
        memo["runtime"] = runtime
        runtime.ready = True
        log.info(
            "Operator started (namespaces=%s leader_election=%s metrics=%s:%d)",
            ",".join(config.namespaces) or "*",
            config.leader_election,
            config.metrics_host,
            config.metrics_port,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime | None = memo.get("runtime")
        if runtime is None:
            return
        runtime.ready = False
        for task in runtime.tasks:
            task.cancel()
        await asyncio.gather(*runtime.tasks, return_exceptions=True)
        if runtime.queue is not None:
            await runtime.queue.close()
        if runtime.server is not None:
            await runtime.server.cleanup()
        await runtime.client.close()

    @kopf.on.event("disagg.dev", "v1alpha1", "disaggregatedmodels", registry=registry)
    async def model_event(
        name: str, namespace: str | None, event: kopf.RawEvent, memo: Any, **_: Any
    ) -> None:
        runtime: Runtime | None = memo.get("runtime")
        if runtime is None or not namespace:
            return
        if runtime.reconciler.models.seen(event.get("type"), dict(event["object"])):
            runtime.enqueue((namespace, name))  # not the echo of the pass's own status write
