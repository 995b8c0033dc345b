"""Pure drift detection: does a live child still match what the operator wants?

The operator writes only when this says so, which is what keeps a resync of an unchanged
model at zero mutating API calls. Two checks:

* the hash of the desired object, stamped on the child as an annotation at apply time,
  catches every change of the desired state (including fields the operator stopped setting,
  which server-side apply removes);
* a subset comparison of desired against live catches edits made by someone else. The API
  server adds defaults and canonicalizes quantities (``1000m`` becomes ``1``), so values
  are compared semantically, and fields the server added are ignored.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from disagg.api.base import parse_quantity

APPLIED_HASH_ANNOTATION: Final = "disagg.dev/applied-hash"

Obj = dict[str, Any]


def desired_hash(obj: Obj) -> str:
    """A stable digest of a desired object."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()[:16]


def stamp(obj: Obj) -> Obj:
    """The object with its own hash in the applied-hash annotation."""
    digest = desired_hash(obj)
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), APPLIED_HASH_ANNOTATION: digest}
    return {**obj, "metadata": meta}


def _scalars_equal(want: Any, have: Any) -> bool:
    if want == have:
        return True
    if isinstance(want, bool) or isinstance(have, bool):
        return False
    if isinstance(want, int | float | str) and isinstance(have, int | float | str):
        try:
            return parse_quantity(str(want)) == parse_quantity(str(have))
        except ValueError:
            return str(want) == str(have)
    return False


def is_subset(want: Any, have: Any) -> bool:
    """Whether every field of ``want`` is present in ``have`` with an equal value."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return False
        return all(key in have and is_subset(value, have[key]) for key, value in want.items())
    if isinstance(want, list):
        if not isinstance(have, list) or len(want) != len(have):
            return False
        return all(is_subset(w, h) for w, h in zip(want, have, strict=True))
    return _scalars_equal(want, have)


def needs_apply(stamped: Obj, live: Obj | None) -> bool:
    """Whether the stamped desired object must be applied over the live one."""
    if live is None:
        return True
    live_hash = live.get("metadata", {}).get("annotations", {}).get(APPLIED_HASH_ANNOTATION)
    if live_hash != stamped["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]:
        return True
    # List results carry no apiVersion/kind per item; the caller matched those already.
    body = {k: v for k, v in stamped.items() if k not in ("apiVersion", "kind")}
    return not is_subset(body, live)


def drift_view(live: Obj) -> Obj:
    """What a pass reads of a live child other than a Deployment (drift, ownership): all of
    it but its status and the server's bookkeeping (resourceVersion, the managedFields entry
    of the status subresource).

    Controllers that only report on a child (the disruption controller's healthy counts on a
    PodDisruptionBudget, the HPA controller's metrics every 15 seconds) change none of it, so
    their updates wake no pass."""
    meta = dict(live.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta["managedFields"] = [
        entry for entry in meta.get("managedFields") or [] if not entry.get("subresource")
    ]
    return {**{key: value for key, value in live.items() if key != "status"}, "metadata": meta}


def owns_field(live: Obj, manager: str, path: tuple[str, ...]) -> bool:
    """Whether ``manager`` owns the field at ``path`` of a live object, by its managedFields."""
    for entry in live.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("subresource"):
            continue
        fields: Any = entry.get("fieldsV1") or {}
        for part in path:
            fields = fields.get(f"f:{part}") if isinstance(fields, dict) else None
        if fields is not None:
            return True
    return False
