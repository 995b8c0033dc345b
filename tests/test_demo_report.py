"""The demo's summary: phases, pools, attainment, GPU-minutes and actions from samples."""

from __future__ import annotations

from disagg.demo.report import PhaseResult, Sample, summarize, table
from disagg.demo.stack import LoadReport
from disagg.demo.story import STORIES, Phase

PROMPTS = Phase("long-prompts", "long prompts", 3, 30, 12_000, 8, "prefill scales up")
QUIET = Phase("quiet", "quiet", 0, 60, 0, 0, "both scale down")


def _sample(t: float, prefill: int, decode: int) -> Sample:
    return Sample(
        t,
        "",
        {"prefill": prefill, "decode": decode},
        {"prefill": prefill, "decode": decode},
        0.5,
        0.02,
    )


def test_summary_counts_replica_moves_gpu_time_and_attainment() -> None:
    load = LoadReport(sent=4, ok=4, ttfts=[0.5, 0.8, 1.2, 3.0], tpots=[0.01, 0.02, 0.03, 0.05])
    results = [
        PhaseResult(PROMPTS, 0, 30, load, [_sample(0, 1, 1), _sample(10, 2, 1), _sample(20, 3, 1)]),
        PhaseResult(QUIET, 30, 90, None, [_sample(30, 3, 1), _sample(60, 1, 1), _sample(90, 1, 1)]),
    ]
    summary = summarize(results, ttft_slo=1.0, tpot_slo=0.04, gpus={"prefill": 1, "decode": 2})
    prompts, quiet = summary["phases"]
    assert prompts["pools"]["prefill"] == {"start": 1, "highest": 3, "lowest": 1, "end": 3}
    assert prompts["pools"]["decode"]["highest"] == 1
    assert prompts["ttft_attainment"] == 0.5 and prompts["tpot_attainment"] == 0.75
    assert prompts["ttft_p99_seconds"] == 3.0
    assert quiet["pools"]["prefill"]["end"] == 1 and quiet["requests"] == 0
    assert summary["scaling_actions"] == 3  # 1->2, 2->3, then 3->1
    # GPU-seconds: 10*(1+2) + 10*(2+2) + 30*(3+2) + 30*(1+2) = 30 + 40 + 150 + 90 = 310
    assert summary["gpu_minutes"] == round(310 / 60, 2)
    text = table(summary)
    assert "long-prompts" in text and "1->3->3" in text and "50%" in text


def test_every_story_ends_quiet_after_both_waves() -> None:
    for story in STORIES.values():
        names = [p.name for p in story]
        assert names.index("long-prompts") < names.index("long-outputs") < names.index("quiet")
        assert story[-1].rate == 0
