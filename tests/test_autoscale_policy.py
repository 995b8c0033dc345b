"""The autoscaling policy, rule by rule (table-driven), and its PromQL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from disagg.autoscale.combine import apply_budget
from disagg.autoscale.policy import (
    Behavior,
    Decision,
    PoolMemory,
    PoolPolicy,
    Signals,
    decide_pool,
    tolerance,
)
from disagg.autoscale.queries import build_queries
from disagg.perf.buckets import ITL_BUCKETS

NOW = 10_000.0
PREFILL = PoolPolicy(slo=2.0, min_replicas=1, max_replicas=8, gpus_per_replica=1)
DECODE = PoolPolicy(slo=0.05, min_replicas=1, max_replicas=8, gpus_per_replica=2, max_num_seqs=100)
FAST = Behavior(up_window=0, up_cooldown=30, down_window=300, down_cooldown=120, stale_after=60)


def sig(
    p99: float | None,
    rate: float | None = 5.0,
    pods: int = 16,
    age: float = 5.0,
    at: float = NOW,
    **load: float,
) -> Signals:
    return Signals(p99=p99, request_rate=rate, pods_reporting=pods, sampled_at=at - age, **load)


def stable_memory(replicas: int, seconds: float = 400.0) -> PoolMemory:
    memory = PoolMemory()
    for t in range(int(seconds), 0, -15):
        memory.remember(NOW - t, replicas, 600)
    return memory


CASES = [
    # (name, pool, signals, current, ready, policy, memory, last_scale, action, desired, reason fragment)
    ("missing", "prefill", None, 2, 2, PREFILL, None, None, "hold", 2, "metrics missing"),
    ("stale", "prefill", sig(5.0, age=120), 2, 2, PREFILL, None, None, "hold", 2, "stale"),
    (
        "nan-with-traffic",
        "prefill",
        sig(None, rate=3.0),
        2,
        2,
        PREFILL,
        None,
        None,
        "hold",
        2,
        "latency metrics missing",
    ),
    (
        "no-rate",
        "prefill",
        sig(1.0, rate=None),
        2,
        2,
        PREFILL,
        None,
        None,
        "hold",
        2,
        "latency metrics missing",
    ),
    (
        "partial",
        "decode",
        sig(0.2, pods=1),
        2,
        2,
        DECODE,
        None,
        None,
        "hold",
        2,
        "from 1 of 2 ready pods",
    ),
    (
        "breach",
        "prefill",
        sig(3.0),
        2,
        2,
        PREFILL,
        None,
        None,
        "up",
        3,
        "TTFT p99 3000ms vs SLO 2000ms",
    ),
    ("big-breach-capped-2x", "prefill", sig(9.0), 2, 2, PREFILL, None, None, "up", 4, "scale up"),
    # With a 1 s SLO, a p99 read between vLLM's 1 and 2.5 s bounds says how many prompts
    # passed 1 s, not how slow they were: one replica more, not twice the pool.
    (
        "interpolated-breach",
        "prefill",
        sig(2.4),
        4,
        4,
        replace(PREFILL, slo=1.0),
        None,
        None,
        "up",
        5,
        "TTFT p99 2400ms vs SLO 1000ms",
    ),
    (
        "beyond-the-bucket",
        "prefill",
        sig(2.6),
        4,
        4,
        replace(PREFILL, slo=1.0),
        None,
        None,
        "up",
        8,
        "scale up",
    ),
    # The fleet simulator showed minutes of provisioning turning repeated scale-ups into a 3x
    # overshoot: while replicas start, the ready ones' load decides whether more are needed.
    (
        "starting-replicas-cover-it",
        "prefill",
        sig(3.0, queue=6.0),
        2,
        1,
        PREFILL,
        None,
        None,
        "hold",
        2,
        "waiting for 1 starting replica(s)",
    ),
    (
        "starting-but-still-short",
        "prefill",
        sig(9.0),
        3,
        2,
        PREFILL,
        None,
        None,
        "up",
        4,
        "scale up",
    ),
    ("step-limit", "prefill", sig(9.0), 3, 3, PREFILL, None, None, "up", 6, "scale up"),
    ("at-max", "prefill", sig(9.0), 8, 8, PREFILL, None, None, "hold", 8, "at the maximum of 8"),
    (
        "queue-ahead",
        "prefill",
        sig(1.0, queue=12.0),
        2,
        2,
        PREFILL,
        None,
        None,
        "up",
        4,
        "load ahead of latency: 12 waiting, 6.0 per replica (at most 2)",
    ),
    (
        "kv-pressure",
        "decode",
        sig(0.03, kv_usage=0.97),
        2,
        2,
        DECODE,
        None,
        None,
        "up",
        3,
        "load ahead of latency: KV cache 97% used (at most 85%)",
    ),
    (
        "running-pressure",
        "decode",
        sig(0.03, running=210.0),
        2,
        2,
        DECODE,
        None,
        None,
        "up",
        3,
        "load needs 3: 219 sequences",
    ),
    (
        "up-cooldown",
        "prefill",
        sig(3.0),
        2,
        2,
        PREFILL,
        None,
        NOW - 10,
        "hold",
        2,
        "in scale-up cooldown, 10s of 30s since the last resize",
    ),
    ("in-band", "decode", sig(0.052), 2, 2, DECODE, None, None, "hold", 2, "within the SLO's 25%"),
    (
        "down-unstable",
        "prefill",
        sig(0.2),
        4,
        4,
        PREFILL,
        PoolMemory(),
        None,
        "hold",
        4,
        "stabilizing scale-down: 0s of the 300s look-back seen",
    ),
    ("down-stable", "prefill", sig(0.2), 4, 4, PREFILL, "stable-3", None, "down", 3, "scale down"),
    # Every token within vLLM's 10-25 ms bucket reads 24.9 ms, never 20% under a 30 ms SLO;
    # the bucket says it is surely 17% under, and the pool may shrink to what its load needs.
    (
        "quiet-by-its-bucket",
        "decode",
        sig(0.0249, running=100.0),
        4,
        4,
        replace(DECODE, slo=0.03),
        "stable-2",
        None,
        "down",
        2,
        "load needs 2: 104 sequences",
    ),
    (
        "not-surely-quiet",
        "decode",
        sig(0.0251, running=100.0),
        4,
        4,
        replace(DECODE, slo=0.03),
        "stable-2",
        None,
        "hold",
        4,
        "within SLO",
    ),
    (
        "down-cooldown",
        "prefill",
        sig(0.2),
        4,
        4,
        PREFILL,
        "stable-3",
        NOW - 60,
        "hold",
        4,
        "scale-down cooldown",
    ),
    (
        "would-breach-with-fewer",
        "prefill",
        sig(1.5),
        2,
        2,
        PREFILL,
        "stable-1",
        None,
        "hold",
        2,
        "within SLO",
    ),
    (
        "idle-to-min",
        "decode",
        sig(None, rate=0.0),
        5,
        5,
        DECODE,
        "stable-1",
        None,
        "down",
        1,
        "idle",
    ),
    ("below-min", "prefill", None, 0, 0, PREFILL, None, None, "up", 1, "outside bounds"),
    ("above-max", "decode", sig(0.01), 12, 12, DECODE, None, None, "down", 8, "outside bounds"),
]


@pytest.mark.parametrize(
    (
        "pool",
        "signals",
        "current",
        "ready",
        "policy",
        "memory",
        "last",
        "action",
        "desired",
        "reason",
    ),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_rules(
    pool: str,
    signals: Signals | None,
    current: int,
    ready: int,
    policy: PoolPolicy,
    memory: object,
    last: float | None,
    action: str,
    desired: int,
    reason: str,
) -> None:
    if isinstance(memory, str):
        memory = stable_memory(int(memory.split("-")[1]))
    decision = decide_pool(
        pool, signals, current, ready, policy, FAST, memory or PoolMemory(), last, NOW
    )  # type: ignore[arg-type]
    assert (decision.action, decision.desired) == (action, desired), decision.reason
    assert reason in decision.reason


def test_no_flapping_on_histogram_noise_at_a_bucket_edge() -> None:
    # SLO 40ms sits in the 25..50ms ITL bucket; interpolated p99 wobbles inside it.
    policy = PoolPolicy(slo=0.04, min_replicas=1, max_replicas=8, gpus_per_replica=1)
    assert tolerance(0.04, ITL_BUCKETS) == pytest.approx(0.3125)
    memory, replicas, actions = PoolMemory(), 3, []
    for i in range(60):
        p99 = 0.034 + (0.016 if i % 2 else 0.0)  # 34ms, 50ms, 34ms, ...
        decision = decide_pool(
            "decode",
            sig(p99, pods=replicas, at=NOW + i * 15),
            replicas,
            replicas,
            policy,
            FAST,
            memory,
            None,
            NOW + i * 15,
        )
        assert "stale" not in decision.reason
        actions.append(decision.action)
        replicas = decision.desired
    assert set(actions) == {"hold"}


def test_scale_down_only_after_the_window_of_steady_recommendations() -> None:
    memory, replicas = PoolMemory(), 4
    for i in range(30):
        decision = decide_pool(
            "prefill",
            sig(0.3, pods=replicas, at=NOW + i * 15),
            replicas,
            replicas,
            PREFILL,
            FAST,
            memory,
            None,
            NOW + i * 15,
        )
        if decision.action == "down":
            assert i * 15 >= FAST.down_window
            return
    raise AssertionError("never scaled down")


def test_a_held_scale_down_names_the_size_the_look_back_keeps_and_its_age() -> None:
    # Four were asked for 100 s ago; the pool is quiet now and three would do. The hold says
    # what it keeps, since when, and what the pool would shrink to: 200 s more of this.
    memory = stable_memory(3)
    memory.remember(NOW - 100, 4, 600)
    decision = decide_pool("prefill", sig(0.2), 4, 4, PREFILL, FAST, memory, None, NOW)
    assert decision.action == "hold"
    assert decision.reason.startswith(
        "stabilizing scale-down: 4 recommended 100s ago (look-back 300s), 3 now (TTFT p99"
    ), decision.reason


def test_budget_goes_to_the_pool_further_over_its_slo() -> None:
    policies = {"prefill": PREFILL, "decode": DECODE}
    wants = [
        Decision("prefill", 2, 4, "up", "ttft", pressure=1.3),
        Decision("decode", 2, 4, "up", "tpot", pressure=2.0),
    ]
    # Budget 10 GPUs: prefill 1 GPU/replica, decode 2. Both at current: 2 + 4 = 6; 4 left.
    prefill, decode = apply_budget(wants, policies, budget=10)
    assert (decode.desired, decode.limited) == (4, False)
    assert (prefill.desired, prefill.limited) == (2, True) and prefill.action == "hold"
    assert "GPU budget of 10" in prefill.reason
    assert apply_budget(wants, policies, None) == wants


def test_queries_use_the_relabelled_pool_labels_and_overrides() -> None:
    queries = build_queries("vllm", "ns", "m", "decode", 120)
    assert queries["tpotP99"] == (
        "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket"
        '{namespace="ns",disagg_model="m",disagg_role="decode"}[120s])))'
    )
    assert (
        queries["kvUsage"]
        == 'avg(vllm:kv_cache_usage_perc{namespace="ns",disagg_model="m",disagg_role="decode"})'
    )
    sglang = build_queries(
        "sglang", "ns", "m", "prefill", 60, {"queue": "max(my_queue{$selector})"}
    )
    assert "sglang:time_to_first_token_seconds_bucket" in sglang["ttftP99"]
    assert sglang["queue"] == 'max(my_queue{namespace="ns",disagg_model="m",disagg_role="prefill"})'


def test_load_queries_read_the_prefill_phase_histogram_where_the_engine_has_one() -> None:
    from disagg.reconcile.prometheus import cumulative_buckets

    vllm = build_queries("vllm", "ns", "m", "prefill", 120)
    assert vllm["prefillBuckets"] == (
        "sum by (le) (rate(vllm:request_prefill_time_seconds_bucket"
        '{namespace="ns",disagg_model="m",disagg_role="prefill"}[120s]))'
    )
    assert "vllm:prompt_tokens_total" in vllm["promptTokensRate"]
    # The TTFT histogram itself, for the p99 of the prompts that can meet the SLO.
    assert vllm["ttftBuckets"] == (
        "sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
        '{namespace="ns",disagg_model="m",disagg_role="prefill"}[120s]))'
    )
    assert "_sum" in vllm["prefillSeconds"] and "_count" in vllm["prefillSeconds"]
    # SGLang times every request stage in one histogram: the prefill phase is one stage.
    sglang = build_queries("sglang", "ns", "m", "prefill", 60)
    assert sglang["prefillBuckets"] == (
        "sum by (le) (rate(sglang:per_stage_req_latency_seconds_bucket"
        '{namespace="ns",disagg_model="m",disagg_role="prefill",stage="prefill_forward"}[60s]))'
    )
    assert sglang["prefillSeconds"].count('stage="prefill_forward"') == 2
    assert "sglang:prompt_tokens_total" in sglang["promptTokensRate"]
    # Another SGLang version names its stages otherwise: a query override names it.
    custom = build_queries("sglang", "ns", "m", "prefill", 60, {"prefillBuckets": "x{$selector}"})
    assert custom["prefillBuckets"].startswith("x{namespace=")
    # Bucket rates by le, as Prometheus returns them, become an ascending histogram.
    assert cumulative_buckets({"+Inf": 3.0, "0.5": 1.0, "1": 2.0}) == (
        (0.5, 1.0),
        (1.0, 2.0),
        (float("inf"), 3.0),
    )
    assert cumulative_buckets({"+Inf": 0.0, "1": 0.0}) == ()  # nothing observed
    assert cumulative_buckets({"bogus": 1.0}) == ()


def test_an_engine_without_a_metric_gets_no_query_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from disagg.autoscale import queries

    # An engine version without the prefill-phase histogram or the output-token counter: the
    # signals built on them are left out (the policy sizes without them), the rest stay.
    lacking = replace(queries.VLLM, prefill_time=None, generation_tokens=None)
    monkeypatch.setattr(queries, "VLLM", lacking)
    built = build_queries("vllm", "ns", "m", "decode", 60)
    gone = {"prefillSeconds", "prefillBuckets", "generationTokensRate"}
    assert gone.isdisjoint(built) and set(built) == set(queries.SIGNALS) - gone
    # A query override for one of them is the user's, and stays.
    custom = build_queries("vllm", "ns", "m", "decode", 60, {"generationTokensRate": "g"})
    assert custom["generationTokensRate"] == "g"


DECODE_POOL = '{namespace="ns",disagg_model="m",disagg_role="decode"}'


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_a_decode_pool_reads_its_step_time_and_output_tokens_from_either_engine(
    backend: str,
) -> None:
    queries = build_queries(backend, "ns", "m", "decode", 60)
    # A mean, not a quantile: the histogram's sum over its count is exact at any bucket layout.
    itl = f"{backend}:inter_token_latency_seconds"
    assert queries["tpotMean"] == (
        f"sum(rate({itl}_sum{DECODE_POOL}[60s])) / sum(rate({itl}_count{DECODE_POOL}[60s]))"
    )
    generated = f"sum(rate({backend}:generation_tokens_total{DECODE_POOL}[60s]))"
    assert queries["generationTokensRate"] == generated
    # A spec's own query replaces it, with the selector and window substituted.
    custom = {"generationTokensRate": "sum(rate(my_tokens{$selector}[$window]))"}
    query = build_queries(backend, "ns", "m", "decode", 60, custom)["generationTokensRate"]
    assert query == f"sum(rate(my_tokens{DECODE_POOL}[60s]))"


def test_a_disaggregated_prefill_pool_reads_its_engines_step_budget() -> None:
    from conftest import load_example
    from disagg.api import parse_model
    from disagg.reconcile.evaluate import pool_policies

    policies = pool_policies(parse_model(load_example("llama-70b-tp4-tp8")))
    assert policies["prefill"].step_tokens == 16384
    assert policies["decode"].step_tokens is None
    # A colocated engine's steps carry decodes too: its budget is not room for prompts.
    assert pool_policies(parse_model(load_example("colocated")))["prefill"].step_tokens is None


def test_an_sglang_pool_reads_its_p99_against_sglangs_own_buckets() -> None:
    from conftest import load_example
    from disagg.api import parse_model
    from disagg.perf.buckets import SGLANG_ITL_BUCKETS
    from disagg.reconcile.evaluate import pool_policies

    decode = pool_policies(parse_model(load_example("sglang-mooncake")))["decode"]
    assert decode.latency_buckets == SGLANG_ITL_BUCKETS
    assert pool_policies(parse_model(load_example("minimal")))["decode"].latency_buckets == (
        ITL_BUCKETS
    )

    # A 48 ms p99 against a 40 ms SLO: vLLM's 25-50 ms bucket cannot tell it from the SLO
    # (inside its dead band), SGLang's 40-60 ms bucket can, and its pool scales up.
    vllm, sglang = (
        replace(DECODE, slo=0.04, latency_buckets=b) for b in (None, SGLANG_ITL_BUCKETS)
    )
    held = decide_pool("decode", sig(0.048), 2, 2, vllm, FAST, PoolMemory(), None, NOW)
    assert (held.action, held.reason) == (
        "hold",
        "within the SLO's 31% tolerance (TPOT p99 48ms vs SLO 40ms)",
    )
    raised = decide_pool("decode", sig(0.048), 2, 2, sglang, FAST, PoolMemory(), None, NOW)
    assert (raised.action, raised.desired) == ("up", 3), raised.reason
