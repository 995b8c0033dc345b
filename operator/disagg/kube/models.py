"""The models as the watch last delivered them, so a pass reads its model without a GET.

The operator's only model watch is kopf's; its events (and the answers to the operator's own
status writes) are kept here, newest resourceVersion winning, as JSON (each read gets a copy
of its own). A model not kept yet is read from the API server. A pass that read an older
version than the server holds finds out when its status write, guarded by that version, is
refused with a 409: it drops the model here, and the next pass reads it from the server.
The watch may deliver a status write's own echo before the write's answer arrives; what it
delivers during the write is kept but is news only if it turns out newer than the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from disagg.kube.client import KubeClient
from disagg.kube.informer import newer, resource_version

Obj = dict[str, Any]
Key = tuple[str, str]


@dataclass(slots=True)
class _StatusWrite:
    """A status write under way: whether the watch delivered the model meanwhile (most
    likely the write's own echo, arriving before its answer), and the version it answered."""

    held: bool = False
    done: bool = False
    answered: int | None = None


class ModelStore:
    """The latest known body of each model, by (namespace, name)."""

    def __init__(
        self,
        client: KubeClient,
        kind: str = "DisaggregatedModel",
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self._client = client
        self._kind = kind
        self._bodies: dict[Key, tuple[int | None, bytes]] = {}
        self._on_change = on_change
        """Called with (namespace, name) for what a status write held back and turned out
        to be news."""
        self._writing: dict[Key, _StatusWrite] = {}

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
        write = self._writing.get(key)
        if write is None:
            return self._keep(key, obj)
        write.held = self._keep(key, obj) or write.held
        return False

    def record(self, obj: Obj) -> bool:
        """Keep the object as a read or a write's answer has it, if it is newer than what is
        kept; whether it was."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        write = self._writing.get(key)
        if write is not None:
            write.done, write.answered = True, resource_version(obj)
        return self._keep(key, obj)

    @contextmanager
    def writing(self, namespace: str, name: str) -> Iterator[None]:
        """Around a pass's status write: what the watch delivers of the model meanwhile is
        kept without calling it news (the pass knows what it wrote); something newer than
        the write's answer, or anything at all when the write failed, is passed to
        ``on_change`` once the write ends."""
        key = (namespace, name)
        write = self._writing[key] = _StatusWrite()
        try:
            yield
        finally:
            del self._writing[key]
            kept = self._bodies.get(key)
            changed = not write.done or kept is None or newer(kept[0], write.answered)
            if write.held and changed and self._on_change is not None:
                self._on_change(namespace, name)

    def _keep(self, key: Key, obj: Obj) -> bool:
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
