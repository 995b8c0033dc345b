"""Generated client requests against a real router (see router_fuzzing.py): a client's
mistake is a 4xx before the first byte, never a 5xx, a hang or an error after a 200."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dataplane import Proc, engine, router, run
from router_fuzzing import fuzz

SEEDS = (11, 12)
REQUESTS = 1500


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def front(request: pytest.FixtureRequest) -> Iterator[Proc]:
    net = f"127.46.{1 if request.param == 'vllm' else 2}"
    prefill = engine(f"rfuzz-prefill-{request.param}", f"{net}.1", "prefill")
    decode = engine(f"rfuzz-decode-{request.param}", f"{net}.2", "decode")
    proc = router(
        f"rfuzz-router-{request.param}", f"{net}.3", [prefill], [decode],
        "--pd-threshold", "32", "--backend", request.param, "--prefill-bootstrap-port", "5600",
    )  # fmt: skip
    yield proc
    for p in (proc, prefill, decode):
        p.stop()


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_client_requests_get_a_4xx_or_an_answer(front: Proc, seed: int) -> None:
    report = run(fuzz(front.url, seed, REQUESTS))
    assert not report.server_errors, report.server_errors[:5]
    assert not report.hangs, report.hangs[:5]
    assert not report.late_errors, report.late_errors[:5]
    assert not report.unshaped_errors, report.unshaped_errors[:5]
    # Both kinds in number, so the verdict means something.
    ok, refused = (
        report.statuses.get(200, 0),
        sum(n for status, n in report.statuses.items() if 400 <= status < 500),
    )
    assert ok >= 200 and refused >= 300, report.statuses
