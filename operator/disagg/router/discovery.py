"""Where the router's endpoints come from: static URLs, or the pools' Pods in Kubernetes.

Kubernetes discovery watches Pods by label selector (as llm-d's endpoint picker does, and
with no dependency on Services or EndpointSlices): a Running, Ready pod with an IP is an
endpoint at its container port named ``http``; a pod with a deletionTimestamp is draining
and gets no new requests while its in-flight ones finish.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from disagg.kube.client import KubeClient, KubeError
from disagg.naming import SGLANG_BOOTSTRAP_ANNOTATION
from disagg.router.endpoints import Endpoint, Pool

log = logging.getLogger("disagg.router.discovery")
DEFAULT_PORT = 8000


def endpoint_of(pod: dict[str, Any]) -> Endpoint | None:
    """The endpoint a pod offers, or None when it cannot take traffic at all (pure)."""
    status = pod.get("status", {})
    ip = status.get("podIP")
    if not ip or status.get("phase") != "Running":
        return None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    draining = bool(pod.get("metadata", {}).get("deletionTimestamp"))
    if not ready and not draining:
        return None
    port = DEFAULT_PORT
    for container in pod.get("spec", {}).get("containers", []):
        for p in container.get("ports", []):
            if p.get("name") == "http":
                port = int(p["containerPort"])
    annotation = pod.get("metadata", {}).get("annotations", {}).get(SGLANG_BOOTSTRAP_ANNOTATION)
    bootstrap = int(annotation) if annotation and annotation.isdigit() else None
    host = f"[{ip}]" if ":" in ip else ip
    return Endpoint(
        url=f"http://{host}:{port}",
        name=pod["metadata"]["name"],
        bootstrap_port=bootstrap,
        draining=draining or not ready,
    )


async def watch_pool(
    client: KubeClient,
    namespace: str,
    selector: str,
    pool: Pool,
    ready: asyncio.Event | None = None,
) -> None:
    """Keep ``pool`` equal to the Ready pods matching ``selector``, forever."""
    pods: dict[str, dict[str, Any]] = {}
    backoff = 1.0
    while True:
        try:
            items, version = await client.list_with_version("Pod", namespace, selector)
            pods = {p["metadata"]["name"]: p for p in items}
            _publish(pool, pods)
            if ready is not None:
                ready.set()
            backoff = 1.0
            async for kind, obj in client.watch("Pod", namespace, selector, version):
                if kind == "BOOKMARK":
                    continue
                if kind == "ERROR":
                    break
                name = obj.get("metadata", {}).get("name")
                if kind == "DELETED":
                    pods.pop(name, None)
                else:
                    pods[name] = obj
                _publish(pool, pods)
        except asyncio.CancelledError:
            raise
        except (KubeError, OSError, ValueError) as error:
            log.warning(
                "Watching %s pods (%s) failed, retrying in %.0fs: %s",
                pool.role,
                selector,
                backoff,
                error,
            )
            await asyncio.sleep(backoff)
            backoff = min(30.0, backoff * 2)
        except Exception as error:  # httpx transport errors and the like: keep the router serving
            log.warning("Watch of %s pods interrupted: %r", pool.role, error)
            await asyncio.sleep(backoff)
            backoff = min(30.0, backoff * 2)


def _publish(pool: Pool, pods: dict[str, dict[str, Any]]) -> None:
    endpoints = [e for e in (endpoint_of(p) for p in pods.values()) if e is not None]
    before = {e.url for e in pool.available()}
    pool.replace(endpoints)
    after = {e.url for e in pool.available()}
    if before != after:
        log.info("%s endpoints: %s", pool.role, ", ".join(sorted(after)) or "none")
