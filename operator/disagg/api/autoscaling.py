"""`spec.autoscaling`: SLOs, Prometheus, speed limits and query overrides of the autoscaler."""

from __future__ import annotations

from typing import ClassVar, Final, Literal

from pydantic import Field

from disagg.api.base import ApiModel, Duration, parse_duration
from disagg.api.rules import RENAMED, Rule, renamed

DEFAULT_PROMETHEUS_URL: Final = "http://prometheus-operated.monitoring.svc:9090"
"""The Prometheus Operator's Service for a Prometheus in ``monitoring``: where the
autoscaler looks when neither the model nor the operator names one."""
HPA_MAX_STABILIZATION: Final = 3600.0
HPA_MAX_PERIOD: Final = 1800.0
SLO_WINDOW_MIN: Final = 3600.0
"""The shortest compliance window: the fast-burn check reads the last hour."""
SLO_WINDOW_MAX: Final = 90 * 86400.0
"""The longest: what status keeps of it stays a few hundred slots."""


class ScaleUpBehavior(ApiModel):
    """How fast the autoscaler may grow a pool."""

    stabilization_window: Duration = Field(
        default="0s",
        description="A larger size must be recommended this long before it is acted on.",
    )
    max_step: int = Field(default=4, ge=1, le=100, description="Most replicas added per step.")
    cooldown: Duration = Field(default="30s", description="Least time between two scale-ups.")


class ScaleDownBehavior(ApiModel):
    """How fast the autoscaler may shrink a pool: slowly, so it never flaps."""

    stabilization_window: Duration = Field(
        default="5m",
        description="A smaller size must be recommended this long before it is acted on.",
    )
    max_step: int = Field(
        default=100,
        ge=1,
        le=100,
        description="Most replicas removed per step. The default does not limit it: the "
        "pool goes down to the largest size recommended during the stabilization window.",
    )
    cooldown: Duration = Field(
        default="2m", description="Least time after any scaling before a scale-down."
    )


class QueryOverrides(ApiModel):
    """PromQL that replaces a default query. ``$selector`` and ``$window`` are substituted."""

    ttft_p99: str | None = Field(default=None, min_length=1, description="TTFT p99, seconds.")
    tpot_p99: str | None = Field(
        default=None, min_length=1, description="Inter-token p99, seconds."
    )
    queue: str | None = Field(
        default=None, min_length=1, description="Waiting requests in the pool."
    )
    running: str | None = Field(
        default=None, min_length=1, description="Running requests in the pool."
    )
    kv_usage: str | None = Field(
        default=None, min_length=1, description="Mean KV-cache usage, 0..1."
    )
    request_rate: str | None = Field(default=None, min_length=1, description="Requests per second.")
    pods_reporting: str | None = Field(
        default=None, min_length=1, description="Number of pods whose metrics are present."
    )
    last_sample: str | None = Field(
        default=None, min_length=1, description="Unix time of the newest sample (staleness check)."
    )
    prompt_tokens_rate: str | None = Field(
        default=None, min_length=1, description="Prompt tokens the pool computes per second."
    )
    prefill_seconds: str | None = Field(
        default=None, min_length=1, description="Mean prefill-phase time per request, seconds."
    )
    prefill_buckets: str | None = Field(
        default=None,
        min_length=1,
        description="Prefill-phase time histogram: an instant vector of bucket rates by le.",
    )
    ttft_buckets: str | None = Field(
        default=None,
        min_length=1,
        description="TTFT histogram: an instant vector of bucket rates by le (read at a lower "
        "quantile than the p99 when some prompts miss the SLO at any size).",
    )
    tpot_buckets: str | None = Field(
        default=None,
        min_length=1,
        description="Per-request time per output token histogram: an instant vector of "
        "bucket rates by le (the TPOT SLO's error budget counts requests over it).",
    )
    tpot_mean: str | None = Field(
        default=None,
        min_length=1,
        description="Mean time between output tokens, seconds (the decode step time).",
    )
    generation_tokens_rate: str | None = Field(
        default=None,
        min_length=1,
        description="Output tokens the pool generates per second (over the requests reaching "
        "it: how long outputs are getting).",
    )


class AutoscalingSpec(ApiModel):
    """SLO-driven autoscaling: prefill from TTFT, decode from TPOT, read from Prometheus."""

    enabled: bool = Field(default=False, description="Let the autoscaler size both pools.")
    mode: Literal["builtin", "external"] = Field(
        default="builtin",
        description="builtin: the operator's SLO autoscaler sizes the pools. external: the "
        "operator renders a KEDA ScaledObject or an HPA per pool from the same queries and leaves "
        "replica counts to it.",
    )
    external_scaler: Literal["keda", "hpa"] = Field(
        default="keda",
        description="With mode external: KEDA ScaledObjects (Prometheus trigger) or HPAs on "
        "external metrics served by prometheus-adapter.",
    )
    ttft_p99: Duration = Field(
        default="2s", description="Time-to-first-token p99 target; drives the prefill pool."
    )
    tpot_p99: Duration = Field(
        default="50ms",
        description="Inter-token latency (TPOT) p99 target; drives the decode pool.",
    )
    prometheus_url: str | None = Field(
        default=None,
        alias="prometheusURL",
        pattern=r"^https?://",
        description="Prometheus HTTP API the autoscaler (and KEDA, in external mode) queries. "
        "Default: the operator's (its --prometheus-url, the chart's prometheus.url; "
        f"{DEFAULT_PROMETHEUS_URL} unless set), which also holds the TLS and credentials "
        "the operator uses.",
    )
    slo_window: Duration = Field(
        default="672h",
        description="The SLOs' compliance window: a p99 target is met when at most 1% of the "
        "window's requests miss it. Status reports each SLO's attainment and error budget "
        "remaining over it, and a Warning Event says when a burn would spend 2% of the "
        "window's budget in an hour. Default 28 days, the SRE workbook's; Go durations "
        "(672h), 1h to 2160h.",
    )
    interval: Duration = Field(default="15s", description="How often the autoscaler decides.")
    window: Duration = Field(
        default="2m", description="Rate window of the latency and load queries."
    )
    scale_up: ScaleUpBehavior = Field(
        default_factory=ScaleUpBehavior, description="Scale-up speed limits."
    )
    scale_down: ScaleDownBehavior = Field(
        default_factory=ScaleDownBehavior, description="Scale-down speed limits."
    )
    max_total_gpus: int | None = Field(
        default=None,
        alias="maxTotalGPUs",
        ge=1,
        le=1_000_000,
        description="GPU budget of both pools together. Default: none.",
    )
    queries: QueryOverrides | None = Field(
        default=None, description="Replace any of the default PromQL queries."
    )
    prometheus_url_renamed: str | None = Field(
        default=None,
        alias="prometheusUrl",
        description=f"{RENAMED} `prometheusURL` (Kubernetes spells acronyms in capitals): "
        "refused with that message, kept so that a stored model keeps its value.",
    )
    max_total_gpus_renamed: int | None = Field(
        default=None,
        alias="maxTotalGpus",
        description=f"{RENAMED} `maxTotalGPUs`: refused with that message, kept so that a "
        "stored model keeps its value.",
    )

    rules: ClassVar = (
        renamed("prometheusUrl", "prometheusURL", lambda m: m.prometheus_url_renamed),
        renamed("maxTotalGpus", "maxTotalGPUs", lambda m: m.max_total_gpus_renamed),
        Rule(
            cel="duration(self.ttftP99) > duration('0s')",
            message="autoscaling.ttftP99 must be greater than zero",
            check=lambda m: parse_duration(m.ttft_p99) > 0,
            field_path=".ttftP99",
        ),
        Rule(
            cel="duration(self.tpotP99) > duration('0s')",
            message="autoscaling.tpotP99 must be greater than zero",
            check=lambda m: parse_duration(m.tpot_p99) > 0,
            field_path=".tpotP99",
        ),
        Rule(
            cel="duration(self.sloWindow) >= duration('1h') && "
            "duration(self.sloWindow) <= duration('2160h')",
            message="autoscaling.sloWindow must be from 1h to 2160h (90 days)",
            check=lambda m: SLO_WINDOW_MIN <= parse_duration(m.slo_window) <= SLO_WINDOW_MAX,
            field_path=".sloWindow",
        ),
        Rule(
            cel="duration(self.interval) >= duration('1s') && "
            "duration(self.interval) <= duration(self.window)",
            message="autoscaling.interval must be at least 1s and no longer than "
            "autoscaling.window",
            check=lambda m: 1 <= parse_duration(m.interval) <= parse_duration(m.window),
            field_path=".interval",
        ),
        # The HPA (also the one KEDA creates) refuses what its validation does not allow
        # (k8s.io/kubernetes pkg/apis/autoscaling/validation, v1.35): a stabilization window
        # over 3600 s, a policy period over 1800 s, a target value that is not positive.
        Rule(
            cel="self.mode != 'external' || "
            "(duration(self.scaleUp.stabilizationWindow) <= duration('1h') && "
            "duration(self.scaleDown.stabilizationWindow) <= duration('1h'))",
            message="with autoscaling.mode external, scaleUp.stabilizationWindow and "
            "scaleDown.stabilizationWindow must be at most 1h (the HPA's limit)",
            check=lambda m: (
                m.mode != "external"
                or max(
                    parse_duration(m.scale_up.stabilization_window),
                    parse_duration(m.scale_down.stabilization_window),
                )
                <= HPA_MAX_STABILIZATION
            ),
        ),
        Rule(
            cel="self.mode != 'external' || "
            "(duration(self.scaleUp.cooldown) <= duration('30m') && "
            "duration(self.scaleDown.cooldown) <= duration('30m'))",
            message="with autoscaling.mode external, scaleUp.cooldown and scaleDown.cooldown "
            "must be at most 30m (the HPA's longest policy period)",
            check=lambda m: (
                m.mode != "external"
                or max(parse_duration(m.scale_up.cooldown), parse_duration(m.scale_down.cooldown))
                <= HPA_MAX_PERIOD
            ),
        ),
        Rule(
            cel="self.mode != 'external' || "
            "(duration(self.ttftP99) >= duration('1ms') && "
            "duration(self.tpotP99) >= duration('1ms'))",
            message="with autoscaling.mode external, ttftP99 and tpotP99 must be at least 1ms "
            "(the HPA's target is the SLO in milliseconds, and must be positive)",
            check=lambda m: (
                m.mode != "external"
                or min(parse_duration(m.ttft_p99), parse_duration(m.tpot_p99)) >= 0.001
            ),
        ),
    )
