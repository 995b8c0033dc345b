"""Kubernetes Events about a DisaggregatedModel (what `kubectl describe dm` shows)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from disagg.clock import Clock, rfc3339, system_clock
from disagg.kube.client import KubeClient, KubeError
from disagg.naming import MANAGER

log = logging.getLogger("disagg.events")


class EventRecorder:
    """Posts core/v1 Events; a failure to post is logged, never fatal."""

    def __init__(
        self, client: KubeClient, component: str = MANAGER, clock: Clock = system_clock
    ) -> None:
        self._client = client
        self._component = component
        self._clock = clock

    async def normal(self, body: dict[str, Any], reason: str, message: str) -> None:
        await self._post(body, "Normal", reason, message)

    async def warning(self, body: dict[str, Any], reason: str, message: str) -> None:
        await self._post(body, "Warning", reason, message)

    async def _post(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        now = rfc3339(self._clock())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(6)}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": body.get("apiVersion", "disagg.dev/v1alpha1"),
                "kind": body.get("kind", "DisaggregatedModel"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._client.create(event)
        except KubeError as error:
            log.warning("Event not posted for %s/%s: %s", meta["namespace"], meta["name"], error)
