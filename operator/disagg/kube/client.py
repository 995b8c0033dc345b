"""The operator's only Kubernetes I/O: an async REST client with explicit timeouts.

Credentials come from a kubeconfig or the in-cluster service account
(:mod:`disagg.kube.credentials`, read once at startup off the event loop). Every write is
counted by kind and verb, so the operator's metrics show exactly what it changed, and a test
can prove that a resync of an unchanged model writes nothing.

The transport is aiohttp (which kopf already runs on): for the same requests httpx spent
about eight times the CPU, which on a busy control plane is time the API server loses. A
server that cannot be reached or does not answer in time raises ``KubeUnreachable``, a
``KubeError``, so callers handle one exception type.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from yarl import URL

from disagg.kube.credentials import Credentials, load_credentials
from disagg.naming import MANAGER

Obj = dict[str, Any]

RESOURCES: Final[dict[str, tuple[str, str]]] = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Event": ("/api/v1", "events"),
    "Namespace": ("/api/v1", "namespaces"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "ScaledObject": ("/apis/keda.sh/v1alpha1", "scaledobjects"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    "DisaggregatedModel": ("/apis/disagg.dev/v1alpha1", "disaggregatedmodels"),
}
CLUSTER_SCOPED: Final = frozenset({"Namespace"})
TIMEOUT: Final = aiohttp.ClientTimeout(total=15.0, connect=5.0)
TRANSPORT_ERRORS: Final = (aiohttp.ClientError, TimeoutError, OSError)
"""What a call raises when no answer came (raised on as KubeUnreachable)."""


class KubeError(Exception):
    """A failed API call, with the HTTP status and the server's reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeUnreachable(KubeError):
    """No answer: the connection failed, broke, or the server did not answer in time."""

    def __init__(self, method: str, path: str, error: BaseException) -> None:
        detail = str(error) or type(error).__name__
        super().__init__(0, "Unreachable", f"{method} {path}: {detail}")


def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    if not creds.verify:
        return False
    context = ssl.create_default_context(cafile=creds.ca_file)
    if creds.cert_file and creds.key_file:
        context.load_cert_chain(creds.cert_file, creds.key_file)
    return context


def _refusal(status: int, reason: str | None, raw: bytes) -> KubeError:
    """The API server's Status answer as an error (its reason and message, when it sent one)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"reason": reason or "", "message": raw.decode(errors="replace")[:500]}
    return KubeError(status, str(body.get("reason", "")), str(body.get("message", "")))


def resource_path(kind: str, namespace: str | None, name: str | None = None) -> str:
    """The REST path of a kind's collection (or one object of it)."""
    prefix, plural = RESOURCES[kind]
    path = prefix
    if namespace and kind not in CLUSTER_SCOPED:
        path += f"/namespaces/{quote(namespace)}"
    path += f"/{plural}"
    if name:
        path += f"/{quote(name)}"
    return path


WriteHook = Callable[[str, str], None]


class KubeClient:
    """A small async client over the resources the operator manages."""

    def __init__(self, creds: Credentials, on_write: WriteHook | None = None) -> None:
        self._creds = creds
        self._token = creds.token
        self._token_at = time.monotonic()
        self._on_write = on_write or (lambda kind, verb: None)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, on_write: WriteHook | None = None
    ) -> KubeClient:
        """Load credentials off the event loop and open a client."""
        creds = await asyncio.to_thread(load_credentials, kubeconfig)
        return cls(creds, on_write)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        # Opened on first use: a session belongs to the event loop that runs it.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=_ssl_context(self._creds)),
                timeout=TIMEOUT,
                raise_for_status=False,
            )
        return self._session

    def _url(self, path: str) -> URL:
        # The path is quoted already; the host may carry a path prefix (an API proxy).
        return URL(self._creds.host + path, encoded=True)

    async def _headers(self) -> dict[str, str]:
        if self._creds.refresh is not None and time.monotonic() - self._token_at > 60:
            self._token = await asyncio.to_thread(self._creds.refresh)
            self._token_at = time.monotonic()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        headers = await self._headers()
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            async with self._http().request(
                method, self._url(path), params=params, data=data, headers=headers
            ) as response:
                status, reason, raw = response.status, response.reason, await response.read()
        except TRANSPORT_ERRORS as error:
            raise KubeUnreachable(method, path, error) from error
        if status >= 400:
            raise _refusal(status, reason, raw)
        result: Obj = json.loads(raw) if raw else {}
        return result

    async def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        """One object, or None when it does not exist."""
        try:
            return await self._call("GET", resource_path(kind, namespace, name))
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def list_objects(
        self, kind: str, namespace: str | None, selector: str | None = None
    ) -> list[Obj]:
        """Objects of a kind in a namespace (all namespaces with None), by label selector."""
        params = {"labelSelector": selector} if selector else {}
        result = await self._call("GET", resource_path(kind, namespace), params=params)
        items: list[Obj] = result.get("items", [])
        for item in items:
            item.setdefault("kind", kind)
        return items

    async def list_with_version(
        self, kind: str, namespace: str | None, selector: str | None = None
    ) -> tuple[list[Obj], str]:
        """Objects plus the list's resourceVersion, to start a watch from."""
        params = {"labelSelector": selector} if selector else {}
        result = await self._call("GET", resource_path(kind, namespace), params=params)
        return result.get("items", []), str(result.get("metadata", {}).get("resourceVersion", ""))

    async def watch(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None,
        resource_version: str,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Watch events (type, object) until the server ends the stream."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if selector:
            params["labelSelector"] = selector
        path = resource_path(kind, namespace)
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=timeout_seconds + 30.0)
        try:
            async with self._http().get(
                self._url(path), params=params, headers=await self._headers(), timeout=timeout
            ) as response:
                if response.status >= 400:
                    raise _refusal(response.status, response.reason, await response.read())
                # Lines are split here: aiohttp's readline refuses lines over 64 KiB, and one
                # event carries a whole object.
                pending = bytearray()
                async for chunk in response.content.iter_any():
                    pending += chunk
                    start = 0
                    while (end := pending.find(b"\n", start)) >= 0:
                        line = bytes(pending[start:end])
                        start = end + 1
                        if line.strip():
                            event = json.loads(line)
                            yield str(event.get("type")), event.get("object", {})
                    del pending[:start]
        except TRANSPORT_ERRORS as error:
            raise KubeUnreachable("WATCH", path, error) from error

    async def apply(
        self, obj: Obj, *, force: bool = True, manager: str = MANAGER, dry_run: bool = False
    ) -> Obj:
        """Server-side apply under a field manager (the operator's by default). A dry run
        (strict field validation, as ``kubectl apply --server-side --dry-run=server`` sends
        it) stores nothing and is not counted as a write."""
        kind = obj["kind"]
        meta = obj["metadata"]
        params = {"fieldManager": manager, "force": "true" if force else "false"}
        if dry_run:
            params |= {"dryRun": "All", "fieldValidation": "Strict"}
        else:
            self._on_write(kind, "apply")
        return await self._call(
            "PATCH",
            resource_path(kind, meta.get("namespace"), meta["name"]),
            params=params,
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        """JSON merge patch of an object."""
        self._on_write(kind, "patch")
        return await self._call(
            "PATCH",
            resource_path(kind, namespace, name),
            params={"fieldManager": MANAGER},
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def create(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        """POST a new object. A dry run (strict field validation, as ``kubectl create
        --dry-run=server`` and ``kubectl apply`` of a new object send it) stores nothing and
        is not counted as a write."""
        kind = obj["kind"]
        params = {"fieldManager": MANAGER}
        if dry_run:
            params |= {"dryRun": "All", "fieldValidation": "Strict"}
        else:
            self._on_write(kind, "create")
        return await self._call(
            "POST", resource_path(kind, obj["metadata"].get("namespace")), params=params, body=obj
        )

    async def replace(self, obj: Obj) -> Obj:
        """PUT (optimistic concurrency through metadata.resourceVersion)."""
        kind = obj["kind"]
        meta = obj["metadata"]
        self._on_write(kind, "update")
        return await self._call(
            "PUT",
            resource_path(kind, meta.get("namespace"), meta["name"]),
            params={"fieldManager": MANAGER},
            body=obj,
        )

    async def delete(
        self, kind: str, namespace: str | None, name: str, uid: str | None = None
    ) -> bool:
        """Delete (background propagation); False when it was already gone."""
        body: Obj = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        self._on_write(kind, "delete")
        try:
            await self._call("DELETE", resource_path(kind, namespace, name), body=body)
        except KubeError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    async def delete_now(self, kind: str, namespace: str | None, name: str) -> bool:
        """Delete with a zero grace period (what a kubelet does once containers have exited)."""
        self._on_write(kind, "delete")
        try:
            await self._call(
                "DELETE", resource_path(kind, namespace, name), body={"gracePeriodSeconds": 0}
            )
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Obj, resource_version: str | None = None
    ) -> Obj:
        """Merge-patch the status subresource; with ``resource_version``, only if unchanged
        since then (a 409 otherwise), so two writers never silently overwrite each other."""
        self._on_write(kind, "patch-status")
        body: Obj = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._call(
            "PATCH",
            resource_path(kind, namespace, name) + "/status",
            params={"fieldManager": MANAGER},
            body=body,
            content_type="application/merge-patch+json",
        )
