"""`spec.router`: the OpenAI-compatible front door, how it picks workers, and when a decode
engine prefills a follow-up turn itself."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from disagg.api.base import ApiModel
from disagg.api.container import ResourceRequirements
from disagg.api.rules import Rule


class LocalPrefillSpec(ApiModel):
    """When the decode engine holding most of a prompt prefills the rest itself."""

    max_uncached_tokens: int = Field(
        default=512,
        ge=0,
        le=2**31 - 1,
        description="The decode engine prefills a prompt itself when at most this many of "
        "its tokens are not already cached there; 0 turns local prefill off.",
    )
    min_cached_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="... and at least this fraction of the prompt is cached there.",
    )


class PrefillOffloadSpec(ApiModel):
    """When a decode engine prefills a short prompt itself because the prefill pool is
    backed up (conditional disaggregation)."""

    max_prompt_tokens: int = Field(
        default=2048,
        ge=0,
        le=2**31 - 1,
        description="Prompts up to this many tokens may be prefilled by a decode engine "
        "while the prefill pool is backed up; longer ones always wait for the prefill pool. "
        "0 turns offloading off.",
    )
    wait_fraction: float = Field(
        default=0.5,
        gt=0,
        le=100,
        description="Offload while a prompt would wait longer than this fraction of "
        "spec.autoscaling.ttftP99 at the least backed-up prefill engine (prompt tokens "
        "in flight there over the rate it finishes them).",
    )
    per_decode_engine: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Offloaded prompts one decode engine computes at once (each until its "
        "first token): every decode step that carries a prompt chunk is slower for every "
        "sequence in it.",
    )


RouterKind = Literal["builtin", "inferencePool"]


class RouterSpec(ApiModel):
    """The OpenAI-compatible front door that sends each request to prefill, then decode."""

    enabled: bool = Field(default=True, description="Deploy the router.")
    kind: RouterKind = Field(
        default="builtin",
        description="builtin: this project's router behind a ClusterIP Service. "
        "inferencePool: the Gateway API Inference Extension's way, as llm-d serves P/D: an "
        "InferencePool over the engine pods (labelled llm-d.ai/role), llm-d's endpoint "
        "picker (llm-d-inference-scheduler v0.4.0, its P/D profile handler deciding by "
        "prefillThresholdTokens) as the router, and llm-d's routing sidecar in front of "
        "each decode engine; spec.gateway's HTTPRoute sends requests to the InferencePool. "
        "Needs spec.gateway, the Inference Extension's CRDs (InferencePool v1, "
        "InferenceObjective) and a Gateway that supports them. The router's policy, local "
        "prefill and offload settings apply to the builtin router only.",
    )
    sidecar_image: str | None = Field(
        default=None,
        min_length=1,
        description="With kind inferencePool: the routing sidecar's image (llm-d's "
        "llm-d-routing-sidecar v0.4.0 by default); `image` names the endpoint picker's.",
    )
    replicas: int = Field(
        default=2,
        ge=0,
        le=100,
        description="Router replicas: two by default, spread over nodes, with a "
        "PodDisruptionBudget that lets one go at a time, so a node drain or a rollout keeps "
        "the model reachable.",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Router HTTP port.")
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Router image override (with kind inferencePool, the endpoint picker's).",
    )
    prefill_threshold_tokens: int = Field(
        default=256,
        ge=0,
        le=2**31 - 1,
        description="Prompts shorter than this (in tokens) skip the prefill pool and go "
        "straight to decode; 0 sends every request through prefill.",
    )
    policy: Literal["cache-aware", "least-outstanding", "round-robin", "prefix-affinity"] = Field(
        default="cache-aware",
        description="How a worker is picked. cache-aware: the engine the router sent the "
        "prompt's leading blocks to before (it likely still caches them), unless that engine "
        "is overloaded, else as least-outstanding; on single-shot traffic with no shared "
        "prefix it is least-outstanding. least-outstanding: with the vLLM backend, the "
        "prefill engine with the fewest prompt tokens in flight from this router; otherwise "
        "the less busy of two at random by requests in flight. round-robin. prefix-affinity: "
        "a hash of the prompt's first 256 characters.",
    )
    local_prefill: LocalPrefillSpec = Field(
        default_factory=LocalPrefillSpec,
        description="With the cache-aware policy (vLLM backend): when a decode engine "
        "computes a follow-up turn's prompt itself instead of fetching its KV from the "
        "prefill pool, decided on the part of the prompt it does not hold.",
    )
    prefill_offload: PrefillOffloadSpec = Field(
        default_factory=PrefillOffloadSpec,
        description="vLLM backend: while the prefill pool is backed up (a burst arrives "
        "faster than prefill replicas start), short prompts are prefilled by a decode "
        "engine with room instead of waiting.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Router CPU and memory."
    )

    rules: ClassVar = (
        Rule(
            cel="!self.enabled || self.replicas >= 1",
            message="router.replicas must be >= 1 when the router is enabled",
            check=lambda m: not m.enabled or m.replicas >= 1,
            field_path=".replicas",
        ),
    )
