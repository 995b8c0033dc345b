"""Leader election over a coordination.k8s.io Lease, so two operator replicas run safely.

Only the leader reconciles; a standby keeps watching and takes over once the leader's lease
has not been renewed for ``lease_seconds``. Times are RFC 3339 with microseconds, as
client-go's resource lock writes them, so the lease reads the same to kubectl and to
Go controllers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import Any

from disagg.clock import Clock, parse_time, system_clock
from disagg.kube.client import KubeClient, KubeError

log = logging.getLogger("disagg.leader")


def _fmt(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_expired(spec: dict[str, Any], now: dt.datetime) -> bool:
    """Whether a lease's holder has missed its renewal deadline (pure)."""
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    if renewed is None:
        return True
    return now > renewed + dt.timedelta(seconds=int(spec.get("leaseDurationSeconds", 15)))


class LeaderElector:
    """Acquires and renews a Lease; calls back on gaining and losing leadership."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        on_change: Callable[[bool], None],
        lease_seconds: int = 15,
        renew_seconds: float = 4.0,
        clock: Clock = system_clock,
    ) -> None:
        self._clock = clock
        self._client = client
        self._namespace = namespace
        self._name = name
        self._on_change = on_change
        self._lease_seconds = lease_seconds
        self._renew_seconds = renew_seconds
        self.identity = (
            f"{os.environ.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"
        )
        self.leading = False

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info(
                "Leadership %s (identity=%s lease=%s/%s)",
                "acquired" if leading else "lost",
                self.identity,
                self._namespace,
                self._name,
            )
            self._on_change(leading)

    def _lease(self, spec: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self._name, "namespace": self._namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def try_once(self) -> bool:
        """One acquire-or-renew round; returns whether this replica leads afterwards."""
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        current = await self._client.get("Lease", self._namespace, self._name)
        mine = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_seconds,
            "renewTime": _fmt(now),
        }
        try:
            if current is None:
                await self._client.create(
                    self._lease({**mine, "acquireTime": _fmt(now), "leaseTransitions": 0}, None)
                )
                return True
            spec = current.get("spec", {})
            version = current["metadata"]["resourceVersion"]
            if spec.get("holderIdentity") == self.identity:
                await self._client.replace(self._lease({**spec, **mine}, version))
                return True
            if lease_expired(spec, now):
                transitions = int(spec.get("leaseTransitions", 0)) + 1
                await self._client.replace(
                    self._lease(
                        {**mine, "acquireTime": _fmt(now), "leaseTransitions": transitions}, version
                    )
                )
                return True
        except KubeError as error:
            if error.status in (409, 422):  # someone else won the race
                return False
            raise
        return False

    async def run(self) -> None:
        """Keep trying forever; on any API error, assume leadership is lost (fail safe)."""
        while True:
            try:
                self._set(await self.try_once())
            except (KubeError, OSError) as error:
                log.warning("Lease round failed: %s", error)
                self._set(False)
            await asyncio.sleep(self._renew_seconds)
