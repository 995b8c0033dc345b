"""Reading the autoscaling signals from Prometheus (the autoscaler's only I/O besides Kubernetes).

prometheus-api-client is synchronous (requests), so every query runs in a worker thread with
an explicit timeout; the event loop never blocks on Prometheus. Any failure (connection
refused, timeout, a query error) raises :class:`MetricsUnavailable`, which the loop turns into
``ScalingActive=False`` / ``MetricsUnavailable`` while holding replicas.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.exceptions import RequestException

from disagg.autoscale.inputs import clean_buckets
from disagg.autoscale.policy import Signals
from disagg.autoscale.queries import DECODE_LOAD, PREFILL_LOAD, Signal
from disagg.prometheus_access import PrometheusAccess

QUERY_TIMEOUT = 5


class MetricsUnavailable(RuntimeError):
    """Prometheus could not answer."""


def _scalar(result: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(value, sample time) of an instant vector with at most one series; NaN becomes None."""
    if not result:
        return None, None
    stamp, raw = result[0]["value"]
    value = float(raw)
    if math.isnan(value) or math.isinf(value):
        return None, float(stamp)
    return value, float(stamp)


class PrometheusSource:
    """Instant queries against one Prometheus."""

    def __init__(
        self, url: str, access: PrometheusAccess | None = None, timeout: int = QUERY_TIMEOUT
    ) -> None:
        self.url = url
        self._timeout = timeout
        self._access = access or PrometheusAccess()
        self._client = self._access.client(url, timeout)

    def _query(self, promql: str) -> list[dict[str, Any]]:
        try:
            result: list[dict[str, Any]] = self._client.custom_query(promql, timeout=self._timeout)
        except (RequestException, PrometheusApiClientException, ValueError) as error:
            raise MetricsUnavailable(self._access.failure(self.url, promql, error)) from error
        return result

    async def query(self, promql: str) -> tuple[float | None, float | None]:
        """One instant query's value and sample time, off the event loop."""
        result = await asyncio.wait_for(asyncio.to_thread(self._query, promql), self._timeout + 2)
        return _scalar(result)

    async def vector(self, promql: str, label: str = "pod") -> dict[str, float]:
        """An instant vector as {label value: value} (NaN samples dropped)."""
        result = await asyncio.wait_for(asyncio.to_thread(self._query, promql), self._timeout + 2)
        values = {}
        for item in result:
            value = float(item["value"][1])
            if not math.isnan(value):
                values[str(item["metric"].get(label, ""))] = value
        return values

    async def signals(self, queries: dict[Signal, str], latency: Signal) -> Signals:
        """One pool's signals; ``latency`` names its SLO signal (ttftP99 or tpotP99)."""
        try:
            values = await asyncio.gather(
                *(
                    self.query(queries[s])
                    for s in (
                        latency,
                        "requestRate",
                        "queue",
                        "running",
                        "kvUsage",
                        "podsReporting",
                        "lastSample",
                    )
                )
            )
            # Only the TTFT-driven pool is sized from its prefill load, and only the
            # TPOT-driven one learns its step time.
            sized = latency == "ttftP99"
            load = await asyncio.gather(
                *(self._optional(queries.get(s) if sized else None) for s in PREFILL_LOAD),
                *(self._optional(None if sized else queries.get(s)) for s in DECODE_LOAD),
            )
            # The budget histogram of each pool's own SLO: TTFT per request (prefill),
            # time per output token per request (decode).
            histograms: dict[Signal, bool] = {
                "prefillBuckets": sized, "ttftBuckets": sized, "tpotBuckets": not sized,
            }  # fmt: skip
            buckets, ttft_buckets, tpot_buckets = await asyncio.gather(
                *(
                    self.vector(queries[s], label="le") if read and s in queries else _nothing()
                    for s, read in histograms.items()
                )
            )
        except TimeoutError as error:
            raise MetricsUnavailable(
                f"Prometheus at {self.url} did not answer in {self._timeout}s"
            ) from error
        (p99, _), (rate, _), (queue, _), (running, _), (kv, _), (pods, _), (last, _) = values
        prompt_tokens, prefill_seconds, tpot_mean, generation_tokens = load
        return Signals(
            p99=p99,
            request_rate=rate,
            queue=queue,
            running=running,
            kv_usage=kv,
            pods_reporting=int(pods or 0),
            sampled_at=last if last is not None else 0.0,
            prompt_tokens_rate=prompt_tokens,
            prefill_seconds=prefill_seconds,
            prefill_buckets=cumulative_buckets(buckets),
            ttft_buckets=cumulative_buckets(ttft_buckets),
            slo_buckets=cumulative_buckets(ttft_buckets if sized else tpot_buckets),
            tpot_mean=tpot_mean,
            generation_tokens_rate=generation_tokens,
        )

    async def _optional(self, promql: str | None) -> float | None:
        return None if promql is None else (await self.query(promql))[0]


@dataclass
class PrometheusSources:
    """The source for each Prometheus URL, made once with the operator's access settings;
    a model that names no URL gets the operator's default."""

    access: PrometheusAccess = field(default_factory=PrometheusAccess)
    _by_url: dict[str, PrometheusSource] = field(default_factory=dict)

    def __call__(self, url: str | None) -> PrometheusSource:
        url = url or self.access.default_url
        if url not in self._by_url:
            self._by_url[url] = PrometheusSource(url, self.access)
        return self._by_url[url]


async def _nothing() -> dict[str, float]:
    return {}


def cumulative_buckets(by_le: dict[str, float]) -> tuple[tuple[float, float], ...]:
    """A histogram's bucket rates keyed by ``le`` as ascending (bound, rate) pairs; empty
    when a bucket label is not a number, or when :func:`clean_buckets` finds no histogram in
    them (nothing observed, no +Inf bucket, counts that fall)."""
    try:
        pairs = tuple((float(le), value) for le, value in by_le.items())
    except ValueError:
        return ()
    return clean_buckets(pairs)
