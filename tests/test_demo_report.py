"""The demo's summary: phases, pools, attainment, GPU-minutes and actions from samples."""

from __future__ import annotations

from disagg.demo.load import LoadReport
from disagg.demo.report import PhaseResult, Sample, summarize, table
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


CHAT = Phase("chat", "steady chat", 2, 30, 600, 48, "both hold")


def _with_engine(t: float, engines: int) -> Sample:
    sample = _sample(t, 1, 1)
    sample.replicas["engine"] = sample.ready["engine"] = engines
    return sample


def test_the_colocated_contrast_is_reported_beside_the_split() -> None:
    def load(*gaps: float) -> LoadReport:
        # One request per two gaps: its mean time per token averages a stall away.
        tpots = [sum(gaps[i : i + 2]) / 2 for i in range(0, len(gaps), 2)]
        return LoadReport(len(tpots), len(tpots), 0, [0.3] * len(tpots), tpots, list(gaps))

    def phase(
        story: Phase,
        start: float,
        engines: tuple[int, int],
        itl: tuple[float, float],
        split: LoadReport,
        colocated: LoadReport,
    ) -> PhaseResult:
        samples = [_with_engine(start, engines[0]), _with_engine(start + 30, engines[1])]
        result = PhaseResult(story, start, start + 30, split, samples, colocated)
        result.engine_itl_p99, result.colocated_engine_itl_p99 = itl
        return result

    stalled = load(*[0.011, 0.078] * 3, *[0.011] * 94)
    results = [
        phase(CHAT, 0, (2, 2), (0.010, 0.011), load(*[0.010] * 100), load(*[0.011] * 100)),
        phase(PROMPTS, 30, (2, 4), (0.011, 0.078), load(*[0.011] * 100), stalled),
    ]  # fmt: skip
    summary = summarize(results, 1.0, 0.04, gpus={"prefill": 1, "decode": 1, "engine": 1})
    contrast = summary["contrast"]
    assert contrast["colocated"]["wave_over_chat"] == 7.09  # 78 ms against 11 ms
    assert contrast["disaggregated"]["wave_over_chat"] == 1.1  # 11 ms against 10 ms
    wave = summary["phases"][1]["colocated"]
    assert wave["client_itl_p99_seconds"] == 0.078  # the client saw the same stalls
    assert wave["tpot_p99_seconds"] < 0.078  # a request's mean time per token hides them
    assert summary["phases"][1]["pools"]["engine"] == {
        "start": 2, "highest": 4, "lowest": 2, "end": 4,
    }  # fmt: skip
    # The engine pool's moves are the contrast model's, not the split's scaling actions.
    assert summary["scaling_actions"] == 0
    assert summary["colocated"]["gpu_minutes"] == round((30 * 2 + 30 * 2) / 60, 2)
    text = table(summary)
    assert "colocated model of the same engines" in text and "(7.09x)" in text
    assert "2->4->4" in text and "78ms" in text
