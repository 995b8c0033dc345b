"""Generated models judged by the parser and the API server alike (see fuzzing.py): no
crash, no disagreement, and nothing either accepts renders children the API server refuses."""

from __future__ import annotations

import pytest

from fuzzing import CLASSES, class_models, judge, run
from harness import Kube

SEEDS = (11, 12)
MODELS = 2000


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_models_are_judged_alike_and_render_what_the_api_server_takes(
    kube: Kube, namespace: str, seed: int
) -> None:
    report = run(kube, namespace, seed, MODELS)
    assert not report.crashes, report.crashes[:5]
    assert not report.disagreements, report.disagreements[:5]
    assert not report.refused_children, list(report.refused_children.items())[:5]
    # Enough of both kinds that the verdicts mean something.
    assert report.accepted >= 50 and report.refused >= 1000, (report.accepted, report.refused)


def test_each_kind_of_value_once_judged_apart_is_judged_alike_case_by_case(
    kube: Kube, namespace: str
) -> None:
    models = class_models()
    report = judge(kube, namespace, models)
    assert not report.crashes, report.crashes[:5]
    assert not report.disagreements, report.disagreements[:5]
    assert not report.refused_children, list(report.refused_children.items())[:5]
    # Every kind has cases on both sides of its rule (the rule, not a blanket refusal).
    for kind in CLASSES:
        names = [m["metadata"]["name"] for m, said in models if said[0].startswith(kind)]
        taken = [name for name in names if name in report.accepted_names]
        assert 0 < len(taken) < len(names), (kind, taken, names)
