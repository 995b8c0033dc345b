"""An in-memory stand-in for the Kubernetes API server, with the surface of ``KubeClient``.

It keeps what the orchestration depends on, so the fast suite can test it in milliseconds:

* server-side apply by field manager: each manager owns the leaf fields it applied (lists
  are atomic); a field a manager stops applying is removed unless another manager owns it
  (then ``spec.replicas`` falls back to 1, as a Deployment's default does); a merge patch is
  an Update and takes the fields it sets; ``managedFields`` reads as the real one does;
* ``resourceVersion`` on every write, ``generation`` on spec changes, 409 on a stale
  precondition, 404s, label selectors (``k=v`` and ``k``);
* every write recorded as (kind, verb, manager), failures injectable per (kind, verb);
* a watch stream fed by the test, for the router's pod watch;
* the Deployment controller's first step: soon after a Deployment's spec changes, its
  ``status.observedGeneration`` catches up (a watch event; a new pod template leaves no
  replica updated yet), unless ``deployment_controller`` is off;
* an apply is answered after a yield to the event loop, so concurrent applies overlap; a
  RoleBinding is refused while its Role does not exist (the escalation check's answer to a
  caller without ``bind``).

It does not validate objects (the e2e suite runs the real API server for that).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator
from typing import Any

from disagg.kube.client import KubeError
from disagg.naming import MANAGER

Obj = dict[str, Any]
Path = tuple[str, ...]
ObjectKey = tuple[str, str, str]


def _leaves(value: Any, prefix: Path = ()) -> set[Path]:
    if isinstance(value, dict):  # an empty map owns nothing
        return set().union(set(), *(_leaves(v, (*prefix, k)) for k, v in value.items()))
    return {prefix}


def _get(obj: Obj, path: Path) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _set(obj: Obj, path: Path, value: Any) -> None:
    for part in path[:-1]:
        obj = obj.setdefault(part, {})
    obj[path[-1]] = copy.deepcopy(value)


def _remove(obj: Obj, path: Path) -> None:
    parents = [obj]
    for part in path[:-1]:
        obj = obj.get(part, {})
        parents.append(obj)
    obj.pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):  # drop maps left empty
        if parents[depth] == {}:
            parents[depth - 1].pop(path[depth - 1], None)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _fields_v1(paths: set[Path]) -> Obj:
    tree: Obj = {}
    for path in paths:
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if key not in labels or ("=" in term and labels[key] != value):
            return False
    return True


class FakeKube:
    """The objects, their field owners and every write made."""

    def __init__(self) -> None:
        self.objects: dict[ObjectKey, Obj] = {}
        self.owners: dict[ObjectKey, dict[str, set[Path]]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.failures: dict[tuple[str, str], KubeError] = {}
        self.watchers: list[tuple[str, asyncio.Queue[tuple[str, Obj] | None]]] = []
        """Each open watch: its kind and what the server has sent it and it has not read."""
        self.gets: list[str] = []
        """The kind of every single-object read served."""
        self.lists: list[str] = []
        """The kind of every list served."""
        self.in_flight = 0
        self.peak_in_flight = 0
        """Applies sent and not yet answered (now, and the most there have been at once)."""
        self._versions = itertools.count(1)
        self.deployment_controller = True
        self._observing: set[ObjectKey] = set()
        self._observed_templates: dict[ObjectKey, Any] = {}

    # test helpers ------------------------------------------------------------------

    def fail_next(self, kind: str, verb: str, status: int, message: str = "injected") -> None:
        self.failures[kind, verb] = KubeError(status, "Injected", message)

    def put(self, obj: Obj) -> Obj:
        """Store an object as if a controller created it (no write recorded)."""
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", f"uid-{meta['name']}")
        stored["metadata"].setdefault("generation", 1)
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        existed = key in self.objects
        self.objects[key] = stored
        self.owners.setdefault(key, {})
        self._notify("MODIFIED" if existed else "ADDED", key)
        return copy.deepcopy(stored)

    def stored(self, kind: str, namespace: str, name: str) -> Obj | None:
        return self.objects.get((kind, namespace, name))

    def set_status(self, kind: str, namespace: str, name: str, status: Obj) -> None:
        """What a controller (the Deployment controller, a kubelet) reports."""
        obj = self.objects[kind, namespace, name]
        obj["status"] = copy.deepcopy(status)
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        self._notify("MODIFIED", (kind, namespace, name))

    def writes_of(self, kind: str | None = None) -> list[tuple[str, str, str]]:
        return [w for w in self.writes if kind is None or w[0] == kind]

    def events(self) -> list[Obj]:
        return [o for (kind, _, _), o in self.objects.items() if kind == "Event"]

    # the KubeClient surface --------------------------------------------------------

    def _write(self, kind: str, verb: str, manager: str = MANAGER) -> None:
        failure = self.failures.pop((kind, verb), None)
        if failure is not None:
            raise failure
        self.writes.append((kind, verb, manager))

    def _notify(self, event: str, key: ObjectKey, gone: Obj | None = None) -> None:
        for kind, queue in self.watchers:
            if kind == key[0]:
                queue.put_nowait((event, copy.deepcopy(gone) if gone else self._view(key)))

    async def delivered(self) -> None:
        """Wait until every open watch has read (and acted on) every event sent to it."""
        if self._observing:
            await asyncio.sleep(0)  # one turn of the loop runs every scheduled observation
        assert not self._observing
        await asyncio.gather(*(queue.join() for _, queue in self.watchers))

    async def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        self.gets.append(kind)
        obj = self.objects.get((kind, namespace or "", name))
        return self._view((kind, namespace or "", name)) if obj is not None else None

    def _view(self, key: ObjectKey) -> Obj:
        obj = copy.deepcopy(self.objects[key])
        managers = self.owners.get(key, {})
        obj["metadata"]["managedFields"] = [
            {"manager": m, "operation": "Apply", "fieldsV1": _fields_v1(paths)}
            for m, paths in sorted(managers.items())
            if paths
        ]
        return obj

    async def list_objects(
        self, kind: str, namespace: str | None, selector: str | None = None
    ) -> list[Obj]:
        self.lists.append(kind)
        return [
            self._view(key)
            for key, obj in sorted(self.objects.items())
            if key[0] == kind
            and (namespace is None or key[1] == namespace)
            and matches(obj["metadata"].get("labels", {}), selector)
        ]

    async def list_with_version(
        self, kind: str, namespace: str | None, selector: str | None = None
    ) -> tuple[list[Obj], str]:
        failure = self.failures.pop((kind, "list"), None)
        if failure is not None:
            raise failure
        return await self.list_objects(kind, namespace, selector), str(next(self._versions))

    def send(self, kind: str, event: str, obj: Obj) -> None:
        """A watch event of the server's own making (an ERROR, a late or stale one)."""
        for watched, queue in self.watchers:
            if watched == kind:
                queue.put_nowait((event, copy.deepcopy(obj)))

    async def watch(
        self, kind: str, namespace: str | None, selector: str | None, resource_version: str,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Obj]]:  # fmt: skip
        queue: asyncio.Queue[tuple[str, Obj] | None] = asyncio.Queue()
        watcher = (kind, queue)
        self.watchers.append(watcher)
        try:
            while (event := await queue.get()) is not None:
                try:
                    meta = event[1].get("metadata", {})
                    in_scope = namespace is None or meta.get("namespace") == namespace
                    if event[0] == "ERROR" or (
                        in_scope and matches(meta.get("labels", {}), selector)
                    ):
                        yield event
                finally:
                    queue.task_done()  # the reader asked for the next one: this one is done
            queue.task_done()
        finally:
            self.watchers.remove(watcher)

    def end_watches(self) -> None:
        """The API server closes every watch (as it does at its timeout)."""
        for _, queue in self.watchers:
            queue.put_nowait(None)

    async def apply(self, obj: Obj, *, force: bool = True, manager: str = MANAGER) -> Obj:
        kind, meta = obj["kind"], obj["metadata"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        self._write(kind, "apply", manager)
        role = ("Role", meta.get("namespace", ""), obj.get("roleRef", {}).get("name", ""))
        if kind == "RoleBinding" and key not in self.objects and role not in self.objects:
            # What the escalation check answers a caller without the "bind" verb (the
            # operator's RBAC) when the Role is not there yet.
            raise KubeError(
                404, "NotFound", f'roles.rbac.authorization.k8s.io "{role[2]}" not found'
            )
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # a request in flight: others may arrive before it is stored
        finally:
            self.in_flight -= 1
        applied = {k: v for k, v in copy.deepcopy(obj).items() if k not in ("apiVersion", "kind")}
        applied["metadata"] = {
            k: v for k, v in applied["metadata"].items() if k not in ("name", "namespace")
        }
        paths = _leaves(applied)
        managers = self.owners.setdefault(key, {})
        current = self.objects.get(key)
        if current is None:
            current = {"apiVersion": obj["apiVersion"], "kind": kind, "metadata": {
                "name": meta["name"], "namespace": meta.get("namespace", ""),
                "uid": f"uid-{kind}-{meta['name']}", "generation": 1,
            }}  # fmt: skip
        updated = copy.deepcopy(current)
        for path in managers.get(manager, set()) - paths:
            if not any(path in p for m, p in managers.items() if m != manager):
                _remove(updated, path)
        for path in paths:
            _set(updated, path, _get(applied, path))
            for other, owned in managers.items():
                if other != manager:
                    owned.discard(path)  # force: the applier takes conflicting fields
        managers[manager] = paths
        if kind == "Deployment":
            updated.setdefault("spec", {}).setdefault("replicas", 1)
        return self._store(key, current if key in self.objects else None, updated)

    def _store(self, key: ObjectKey, before: Obj | None, after: Obj) -> Obj:
        if before is not None and before.get("spec") != after.get("spec"):
            after["metadata"]["generation"] = int(before["metadata"]["generation"]) + 1
        after["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[key] = after
        self._notify("ADDED" if before is None else "MODIFIED", key)
        generation = after["metadata"].get("generation")
        if (
            key[0] == "Deployment"
            and self.deployment_controller
            and (before is None or generation != before["metadata"].get("generation"))
        ):
            self._observing.add(key)
            asyncio.get_running_loop().call_soon(self._observe, key, generation)
        return self._view(key)

    def _observe(self, key: ObjectKey, generation: int) -> None:
        self._observing.discard(key)
        obj = self.objects.get(key)
        if obj is None or obj["metadata"]["generation"] != generation:
            return  # deleted, or changed again: that change schedules its own
        status = {**(obj.get("status") or {}), "observedGeneration": generation}
        template = obj.get("spec", {}).get("template")
        if self._observed_templates.get(key) != template:
            status["updatedReplicas"] = 0  # the new ReplicaSet has no pod yet
        self._observed_templates[key] = copy.deepcopy(template)
        self.set_status(*key, status)

    async def patch(self, kind: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        key = (kind, namespace or "", name)
        self._write(kind, "patch")
        if key not in self.objects:
            raise KubeError(404, "NotFound", f'{kind} "{name}" not found')
        before = self.objects[key]
        for path in _leaves(patch):
            for owned in self.owners.setdefault(key, {}).values():
                owned.discard(path)
        return self._store(key, before, merge_patch(copy.deepcopy(before), patch))

    async def patch_status(
        self, kind: str, namespace: str, name: str, status: Obj, resource_version: str | None = None
    ) -> Obj:
        key = (kind, namespace, name)
        self._write(kind, "patch-status")
        if key not in self.objects:
            raise KubeError(404, "NotFound", f'{kind} "{name}" not found')
        obj = self.objects[key]
        if resource_version and resource_version != obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        obj["status"] = merge_patch(obj.get("status") or {}, status)
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        self._notify("MODIFIED", key)
        return self._view(key)

    async def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        self._write(obj["kind"], "create")
        if key in self.objects:
            raise KubeError(409, "AlreadyExists", f'"{meta["name"]}" already exists')
        self.owners[key] = {}
        return self._store(key, None, copy.deepcopy(obj) | {"metadata": {**meta, "generation": 1}})

    async def replace(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        self._write(obj["kind"], "update")
        current = self.objects.get(key)
        if current is None:
            raise KubeError(404, "NotFound", f'"{meta["name"]}" not found')
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        return self._store(key, current, copy.deepcopy(obj))

    async def delete(
        self, kind: str, namespace: str | None, name: str, uid: str | None = None
    ) -> bool:
        key = (kind, namespace or "", name)
        self._write(kind, "delete")
        obj = self.objects.get(key)
        if obj is None or (uid and obj["metadata"].get("uid") != uid):
            return False
        del self.objects[key]
        self.owners.pop(key, None)
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        self._notify("DELETED", key, gone=obj)
        return True
