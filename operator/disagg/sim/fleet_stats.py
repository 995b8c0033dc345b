"""What a scaling policy sees of one pool of the simulated fleet (:class:`PoolStats`), read
from the requests of the last window and the engines, as Prometheus would read it from the
engines' metrics. Pure: :mod:`disagg.sim.fleet` slices the window and passes it in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from disagg.autoscale.sizing import quantile
from disagg.perf.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from disagg.sim.fleet_types import Engine, FleetConfig, PoolName, PoolStats
from disagg.sim.results import (
    Outcome,
    cumulative_histogram,
    prefill_phase_times,
    reported_p99,
)
from disagg.slo import percentile


def pool_stats(
    pool: PoolName,
    config: FleetConfig,
    now: float,
    recent: Sequence[Outcome],
    served: Sequence[tuple[float, int]],
    observed: Mapping[str, Sequence[tuple[float, float]]],
    engines: Sequence[Engine],
    serving: Sequence[Engine],
) -> PoolStats:
    """``recent``: requests that arrived in the window; ``served``: (time, prompt tokens) of
    those the pool finished in it; ``observed``: (time, the SLO's measure) of the requests
    whose TTFT (prefill) or time per output token (decode) the pool's engines observed in
    it (by ``ttft`` and ``tpot``); ``engines``: the pool's live replicas (draining too);
    ``serving``: those that take requests now."""
    disaggregated = config.mode == "disaggregated"
    done_first = [o for o in recent if o.first_token is not None]
    if pool == "prefill" and disaggregated:
        ttfts = [o.prefill_done - o.request.arrival for o in recent if o.prefill_done is not None]
    else:
        ttfts = [t for o in done_first if (t := o.ttft) is not None]
    # (gaps between its tokens, mean gap) of each request with more than one token
    streams = [(o.tokens - 1, t) for o in done_first if o.tokens > 1 and (t := o.tpot) is not None]
    tpots = [t for _, t in streams]
    gaps = sum(n for n, _ in streams)
    prefill_times = (
        [] if disaggregated and pool == "decode" else prefill_phase_times(recent, disaggregated)
    )
    capacity = sum(e.scheduler.kv_capacity for e in serving) or 1
    # Rates over what has elapsed, but never over less than one interval: a request at
    # t=0 is not a rate of 1e9 per second.
    span = min(config.window, max(now, config.interval))
    prompt_tokens = sum(o.request.prompt_tokens for o in recent)
    ttft_buckets = cumulative_histogram(sorted(ttfts), TTFT_BUCKETS)
    return PoolStats(
        replicas=len([e for e in engines if not e.draining]),
        ready=len(serving),
        ttft_p99=percentile(ttfts, 0.99),
        tpot_p99=percentile(tpots, 0.99),
        queue=sum(len(e.scheduler.waiting) for e in serving),
        running=sum(len(e.scheduler.running) for e in serving),
        kv_usage=sum(e.scheduler.kv_used for e in serving) / capacity,
        request_rate=len(recent) / span,
        prompt_tokens_rate=prompt_tokens / span,
        mean_prompt=prompt_tokens / max(1, len(recent)),
        mean_output=sum(o.request.output_tokens for o in recent) / max(1, len(recent)),
        served_rate=len(served) / span,
        prompt_tokens_served_rate=sum(tokens for _, tokens in served) / span,
        prefill_seconds=sum(prefill_times) / len(prefill_times) if prefill_times else None,
        prefill_buckets=cumulative_histogram(prefill_times, REQUEST_LATENCY_BUCKETS),
        tpot_mean=sum(n * t for n, t in streams) / gaps if gaps else None,
        ttft_buckets=ttft_buckets,
        # The p99 Prometheus reports: histogram_quantile over those same buckets.
        ttft_reported=quantile(ttft_buckets, 0.99),
        # Each stream's gaps counted at its mean gap: the simulator keeps no gap alone.
        tpot_reported=reported_p99([(t, float(n)) for n, t in streams], ITL_BUCKETS),
        ttft_done=cumulative_histogram(sorted(v for _, v in observed["ttft"]), TTFT_BUCKETS),
        tpot_done=cumulative_histogram(sorted(v for _, v in observed["tpot"]), ITL_BUCKETS),
        span=span,
    )
