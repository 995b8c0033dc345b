"""Drift detection decides every write the operator makes."""

from __future__ import annotations

import copy
from typing import Any

from disagg.drift import APPLIED_HASH_ANNOTATION, is_subset, needs_apply, stamp

DESIRED: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "m-prefill", "namespace": "ns", "labels": {"a": "b"}},
    "spec": {
        "replicas": 2,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "resources": {"limits": {"cpu": "1000m", "nvidia.com/gpu": "8"}},
                    }
                ]
            }
        },
    },
}


def _live_from(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: defaults added, quantities canonicalized, no apiVersion/kind in lists."""
    live = copy.deepcopy(desired)
    del live["apiVersion"], live["kind"]
    live["metadata"].update(uid="u", resourceVersion="7", generation=1)
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["cpu"] = "1"
    container["terminationMessagePath"] = "/dev/termination-log"
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    live["status"] = {"replicas": 2}
    return live


def test_fresh_object_needs_apply() -> None:
    assert needs_apply(stamp(DESIRED), None)


def test_server_defaults_and_canonical_quantities_are_not_drift() -> None:
    stamped = stamp(DESIRED)
    assert not needs_apply(stamped, _live_from(stamped))


def test_hand_edit_is_drift() -> None:
    stamped = stamp(DESIRED)
    live = _live_from(stamped)
    live["spec"]["replicas"] = 5
    assert needs_apply(stamped, live)


def test_changed_desired_state_is_detected_by_hash_even_when_a_field_was_removed() -> None:
    stamped = stamp(DESIRED)
    live = _live_from(stamped)
    smaller = copy.deepcopy(DESIRED)
    del smaller["metadata"]["labels"]
    # The new desired state is a subset of live, yet the operator must apply to drop the label.
    assert needs_apply(stamp(smaller), live)


def test_stamp_is_stable_and_annotated() -> None:
    assert stamp(DESIRED) == stamp(copy.deepcopy(DESIRED))
    assert len(stamp(DESIRED)["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]) == 16


def test_subset_rules() -> None:
    assert is_subset({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2, "c": 3}], "d": 4})
    assert not is_subset({"a": [1]}, {"a": [1, 2]}), "lists must match in length"
    assert is_subset({"q": 2}, {"q": "2"}) and is_subset({"m": "512Mi"}, {"m": "0.5Gi"})
    assert not is_subset({"flag": True}, {"flag": "true"})
    assert not is_subset({"name": "a"}, {"name": "b"})
