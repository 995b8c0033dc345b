"""Child names fit Kubernetes' limits and stay stable."""

from __future__ import annotations

import re

from disagg.naming import child_name, fit_name, labels, selector_labels

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_short_names_are_plain() -> None:
    assert child_name("llama", "prefill") == "llama-prefill"
    assert child_name("llama", "router") == "llama-router"


def test_long_names_are_truncated_with_a_stable_hash() -> None:
    model = "a" * 40 + "-" + "b" * 22
    name = child_name(model, "prefill")
    assert len(name) <= 63 and DNS_1035.match(name) and name.endswith("-prefill")
    assert name == child_name(model, "prefill")
    other = child_name(model[:-1] + "c", "prefill")
    assert other != name, "different models must not collide after truncation"


def test_truncation_never_leaves_a_double_dash() -> None:
    name = fit_name("x" * 44 + "-" + "y" * 18, "decode")
    assert "--" not in name and len(name) <= 63


def test_selector_is_a_subset_of_labels() -> None:
    for role in ("prefill", "decode", "router"):
        assert selector_labels("m", role).items() <= labels("m", role).items()
