"""Generated models judged by the parser and the API server alike (see fuzzing.py): no
crash, no disagreement, and nothing either accepts renders children the API server refuses."""

from __future__ import annotations

import pytest

from fuzzing import run
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
