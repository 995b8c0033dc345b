"""The operator's view of its children and their pods: one label-selected list and watch per
kind, kept in memory and indexed by model.

A reconcile pass reads a model's children here instead of listing them (nine lists a pass,
each of them a scan of the namespace on the API server). What a pass applies or deletes is
written in at once (:meth:`ChildCache.record`, :meth:`ChildCache.forget`), newest
resourceVersion winning, so the next pass never sees a child as it was before its own apply
and applies it again; and a watch event that only echoes such a write does not wake the
model. A watch the server ends resumes from the last version seen; one whose version has
expired (410 Gone) lists again. The API server filters by the children's labels, so the
operator's traffic and memory follow its own objects, not every pod of a shared cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from disagg.kube.client import KubeClient, KubeError
from disagg.naming import CHILDREN_SELECTOR, MODEL_LABEL

log = logging.getLogger("disagg.informer")
Obj = dict[str, Any]
ObjectKey = tuple[str, str, str]
"""(kind, namespace, name)"""
WATCH_SECONDS: Final = 300
ABSENT_RETRY_SECONDS: Final = 60.0
"""How often a kind whose API is not installed (KEDA's) is looked for again."""
MAX_BACKOFF: Final = 30.0


@dataclass(frozen=True, slots=True)
class _Entry:
    """One object as kept: its version and model for the index, its body as JSON (a fifth
    of the memory of the parsed object, and every read gets a copy of its own)."""

    version: int | None
    model: str | None
    body: bytes
    view: int | None = None
    """A digest of what a pass reads of it, for kinds with a view (see ``views``)."""


@dataclass(slots=True)
class _Write:
    """A write of one object under way: whether its watch delivered anything meanwhile
    (held back: most likely the write's own echo), and what the write answered."""

    held: str | None = None
    """The model of what the watch delivered, if it did."""
    done: bool = False
    answer: _Entry | None = None
    """What the write answered, as stored (None: a deletion)."""
    deleted: bool = False


def resource_version(obj: Obj) -> int | None:
    """The object's resourceVersion as a number, or None when it is not one (pure)."""
    value = str(obj.get("metadata", {}).get("resourceVersion", ""))
    return int(value) if value.isdigit() else None


def _entry(obj: Obj, view: Callable[[Obj], Obj] | None = None) -> _Entry:
    meta = obj["metadata"]
    return _Entry(
        version=resource_version(obj),
        model=meta.get("labels", {}).get(MODEL_LABEL),
        body=json.dumps(obj, separators=(",", ":")).encode(),
        view=None if view is None else hash(json.dumps(view(obj), sort_keys=True)),
    )


def newer(incoming: int | None, stored: int | None) -> bool:
    """Whether version ``incoming`` is later than ``stored`` (pure). resourceVersions are etcd
    revisions on every API server this runs against; one that is not a number is taken as
    newer, as a watch would deliver it."""
    return incoming is None or stored is None or incoming > stored


class NotSynced(KubeError):
    """A kind has not been listed yet (or listing it keeps failing): a pass must wait."""

    def __init__(self, kind: str, namespace: str, cause: str) -> None:
        super().__init__(503, "NotSynced", f"{kind}s in {namespace} not listed yet: {cause}")


class ChildCache:
    """Every object of ``kinds`` carrying the children's labels, in ``namespaces`` (None: all),
    with ``on_change(namespace, model)`` called when one of a model's objects changes; for a
    kind in ``views``, only when what its view keeps of the object changes."""

    def __init__(
        self,
        client: KubeClient,
        kinds: Iterable[str],
        on_change: Callable[[str, str], None],
        namespaces: tuple[str | None, ...] = (None,),
        optional: frozenset[str] = frozenset(),
        selector: str = CHILDREN_SELECTOR,
        views: Mapping[str, Callable[[Obj], Obj]] | None = None,
    ) -> None:
        self._client = client
        self._views = dict(views or {})
        self._kinds = tuple(kinds)
        self._required = tuple(kind for kind in self._kinds if kind != "Pod")
        self._on_change = on_change
        self._scopes = namespaces
        self._optional = optional
        self._selector = selector
        self._objects: dict[ObjectKey, _Entry] = {}
        self._by_model: dict[tuple[str, str], set[ObjectKey]] = {}
        self._writing: dict[ObjectKey, _Write] = {}
        self._listed: set[tuple[str, str | None]] = set()
        self._failing: dict[tuple[str, str | None], str] = {}
        self._synced = asyncio.Event()

    # reads ---------------------------------------------------------------------------

    async def synced(self) -> None:
        """Wait until every kind a pass needs (all but pods) has been listed once in every
        scope: a pass applies children without pods, so forbidden pods hold nothing up."""
        await self._synced.wait()

    def children(self, namespace: str, model: str) -> dict[tuple[str, str], Obj]:
        """The model's objects other than pods, by (kind, name): copies, the caller's own."""
        self._require_listed(namespace)
        return {
            (key[0], key[2]): json.loads(self._objects[key].body)
            for key in sorted(self._by_model.get((namespace, model), ()))
            if key[0] != "Pod"
        }

    def pods(self, namespace: str, model: str) -> list[Obj]:
        """The model's pods, by name (those seen so far: a pass that cannot read pods still
        applies the children, and reports what refuses it)."""
        return [
            json.loads(self._objects[key].body)
            for key in sorted(self._by_model.get((namespace, model), ()))
            if key[0] == "Pod"
        ]

    def __len__(self) -> int:
        return len(self._objects)

    def _require_listed(self, namespace: str) -> None:
        scope = namespace if namespace in self._scopes else None
        for kind in self._required:
            if (kind, scope) not in self._listed:
                cause = self._failing.get((kind, scope), "the first list is under way")
                raise NotSynced(kind, namespace, cause)

    # what a pass wrote ------------------------------------------------------------------

    @contextmanager
    def writing(self, kind: str, namespace: str, name: str) -> Iterator[None]:
        """Around a pass's write of one object: what the watch delivers for it meanwhile is
        kept without waking its model (the pass knows what it wrote); something newer than
        what the write answered that a pass reads differently (a controller only reporting on
        a child it just created is not that), or anything at all when the write failed,
        still does."""
        key = (kind, namespace, name)
        write = self._writing[key] = _Write()
        try:
            yield
        finally:
            del self._writing[key]
            if write.held is not None and self._changed_since(key, write):
                self._on_change(namespace, write.held)

    def _changed_since(self, key: ObjectKey, write: _Write) -> bool:
        """Whether what is kept now is not what ``write`` left (pure over the store)."""
        entry = self._objects.get(key)
        if not write.done or (entry is None) != write.deleted:
            return True
        if entry is None:
            return False
        answer = write.answer
        if answer is None or answer.version is None or entry.version is None:
            return True
        if entry.version <= answer.version:
            return False
        return entry.view is None or (entry.view, entry.model) != (answer.view, answer.model)

    def record(self, obj: Obj) -> None:
        """An object as the API server answered a write of it (newer than what is here)."""
        entry = self._entry(obj)
        key = _key(obj)
        write = self._writing.get(key)
        if write is not None:
            write.done, write.answer = True, entry
        self._store(key, entry)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """An object the pass deleted."""
        key = (kind, namespace, name)
        write = self._writing.get(key)
        if write is not None:
            write.done, write.deleted = True, True
        if key in self._objects:
            self._remove(key)

    # the watches ---------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch every kind in every scope, forever."""
        await asyncio.gather(
            *(self._follow(kind, scope) for kind in self._kinds for scope in self._scopes)
        )

    async def _follow(self, kind: str, scope: str | None) -> None:
        version: str | None = None
        backoff = 1.0
        while True:
            try:
                if version is None:
                    version = await self._relist(kind, scope)
                async for event, obj in self._client.watch(
                    kind, scope, self._selector, version, timeout_seconds=WATCH_SECONDS
                ):
                    if event == "ERROR":
                        raise KubeError(
                            int(obj.get("code", 500)),
                            str(obj.get("reason", "")),
                            str(obj.get("message", "")),
                        )
                    if event != "BOOKMARK":
                        self._apply_event(event, {**obj, "kind": kind})
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except KubeError as error:
                if error.status == 410:
                    version = None  # too old for the watch cache: list again
                    continue
                if error.status == 404 and kind in self._optional:
                    self._absent(kind, scope)
                    version = None
                    await asyncio.sleep(ABSENT_RETRY_SECONDS)
                    continue
                backoff = await self._failed(kind, scope, error, backoff)
            except Exception as error:  # transport errors, a broken stream: keep following
                backoff = await self._failed(kind, scope, error, backoff)

    async def _failed(
        self, kind: str, scope: str | None, error: Exception, backoff: float
    ) -> float:
        self._failing[kind, scope] = str(error) or type(error).__name__
        log.warning(
            "Watching %ss in %s failed, retrying in %.0fs: %s",
            kind, scope or "all namespaces", backoff, self._failing[kind, scope],
        )  # fmt: skip
        await asyncio.sleep(backoff)
        return min(MAX_BACKOFF, backoff * 2)

    async def _relist(self, kind: str, scope: str | None) -> str:
        items, version = await self._client.list_with_version(kind, scope, self._selector)
        seen: set[ObjectKey] = set()
        for item in items:
            obj = {**item, "kind": kind}
            key = _key(obj)
            seen.add(key)
            self._arrived(key, self._entry(obj))
        for key in [k for k in self._objects if k[0] == kind and _in(scope, k) and k not in seen]:
            self._departed(key)
        self._mark_listed(kind, scope)
        return version

    def _absent(self, kind: str, scope: str | None) -> None:
        """The kind's API is not served: there are none of it."""
        for key in [k for k in self._objects if k[0] == kind and _in(scope, k)]:
            self._departed(key)
        self._mark_listed(kind, scope)

    def _mark_listed(self, kind: str, scope: str | None) -> None:
        self._listed.add((kind, scope))
        self._failing.pop((kind, scope), None)
        if all((k, s) in self._listed for k in self._required for s in self._scopes):
            self._synced.set()

    def _apply_event(self, event: str, obj: Obj) -> None:
        key = _key(obj)
        if event != "DELETED":
            self._arrived(key, self._entry(obj))
            return
        stored = self._objects.get(key)
        # A deletion is the last version of what it deletes; a newer object under the same
        # name is a re-creation a pass already recorded.
        version = _entry(obj).version
        if stored is not None and (version is None or not newer(stored.version, version)):
            self._departed(key)

    def _arrived(self, key: ObjectKey, entry: _Entry) -> None:
        previous = self._objects.get(key)
        if not self._store(key, entry):
            return
        if previous is not None and previous.model not in (None, entry.model):
            self._wake(key, previous.model)  # relabelled away: that model lost a child
        unread = (
            previous is not None
            and entry.view is not None
            and (previous.view, previous.model) == (entry.view, entry.model)
        )
        if not unread:
            self._wake(key, entry.model)

    def _entry(self, obj: Obj) -> _Entry:
        return _entry(obj, self._views.get(obj["kind"]))

    def _departed(self, key: ObjectKey) -> None:
        entry = self._objects.get(key)
        if entry is not None:
            self._remove(key)
            self._wake(key, entry.model)

    def _wake(self, key: ObjectKey, model: str | None) -> None:
        if model is None:
            return
        write = self._writing.get(key)
        if write is not None:
            write.held = model
        else:
            self._on_change(key[1], model)

    # the store -----------------------------------------------------------------------

    def _store(self, key: ObjectKey, entry: _Entry) -> bool:
        """Keep ``entry`` if it is newer than what is here; whether anything changed."""
        stored = self._objects.get(key)
        if stored is not None and not newer(entry.version, stored.version):
            return False
        self._unindex(key)
        self._objects[key] = entry
        if entry.model:
            self._by_model.setdefault((key[1], entry.model), set()).add(key)
        return True

    def _remove(self, key: ObjectKey) -> None:
        self._unindex(key)
        self._objects.pop(key, None)

    def _unindex(self, key: ObjectKey) -> None:
        stored = self._objects.get(key)
        if stored is None or stored.model is None:
            return
        keys = self._by_model.get((key[1], stored.model))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_model[key[1], stored.model]


def _key(obj: Obj) -> ObjectKey:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def _in(scope: str | None, key: ObjectKey) -> bool:
    return scope is None or key[1] == scope
