"""The models as the watch last delivered them, so a pass reads its model without a GET.

The operator's only model watch is kopf's; its events (and the answers to the operator's own
status writes) are kept here, newest resourceVersion winning, as JSON (each read gets a copy
of its own). A model not kept yet is read from the API server. A pass that read an older
version than the server holds finds out when its status write, guarded by that version, is
refused with a 409: it drops the model here, and the next pass reads it from the server.
"""

from __future__ import annotations

import json
from typing import Any

from disagg.kube.client import KubeClient
from disagg.kube.informer import newer, resource_version

Obj = dict[str, Any]
Key = tuple[str, str]


class ModelStore:
    """The latest known body of each model, by (namespace, name)."""

    def __init__(self, client: KubeClient, kind: str = "DisaggregatedModel") -> None:
        self._client = client
        self._kind = kind
        self._bodies: dict[Key, tuple[int | None, bytes]] = {}

    def __len__(self) -> int:
        return len(self._bodies)

    def seen(self, event: str | None, obj: Obj) -> bool:
        """A watch event (None: the object as listed); whether it says anything new (the
        echo of the operator's own status write does not: its answer was recorded)."""
        meta = obj.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event == "DELETED":
            self._bodies.pop(key, None)
            return True
        return self.record(obj)

    def record(self, obj: Obj) -> bool:
        """Keep the object as the watch or a write's answer has it, if it is newer than what
        is kept; whether it was."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        version = resource_version(obj)
        kept = self._bodies.get(key)
        if kept is not None and not newer(version, kept[0]):
            return False
        self._bodies[key] = (version, json.dumps({**obj, "kind": self._kind}).encode())
        return True

    def drop(self, namespace: str, name: str) -> None:
        """Forget a model whose kept version turned out to be old: read it from the server."""
        self._bodies.pop((namespace, name), None)

    async def get(self, namespace: str, name: str) -> Obj | None:
        """The model, from what is kept or else from the API server (None: it is gone)."""
        kept = self._bodies.get((namespace, name))
        if kept is not None:
            body: Obj = json.loads(kept[1])
            return body
        body_or_none = await self._client.get(self._kind, namespace, name)
        if body_or_none is not None:
            self.record(body_or_none)
        return body_or_none
