"""The next step in the decision order for a diagnosed model (pure).

Interference on a colocated model: first a smaller chunked-prefill budget, the largest whose
mixed step (one prompt chunk plus the running batch) keeps TPOT under the SLO while the
longest prompts still meet TTFT, both computed with the engine simulator's latency model
(``perf/roofline.py``); when no budget does both, disaggregate, with the ``disagg plan``
command for the traffic observed. Interference on a disaggregated model comes from prompts
the decode pool prefills itself. Overload: scale the pool that queues.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Final, Literal

from disagg.api.spec import DisaggregatedModelSpec
from disagg.diagnose.series import Timeline
from disagg.diagnose.verdict import Finding
from disagg.perf.roofline import EngineShape, PrefillChunk, step_time
from disagg.slo import Slo

Action = Literal["none", "chunk", "disaggregate", "local-prefill", "scale", "collect", "look"]
BUDGETS: Final = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
TPOT_MARGIN: Final = 0.8
"""A mixed step may use this share of the TPOT SLO: the batch it carries grows with load."""
TTFT_MARGIN: Final = 0.8
"""... and the longest prompt's chunks this share of the TTFT SLO: the rest is queueing."""


@dataclass(frozen=True)
class Traffic:
    """The traffic's shape over the whole range (None: not measured)."""

    rate: float | None = None
    mean_prompt: float | None = None
    p50_prompt: float | None = None
    p90_prompt: float | None = None
    p99_prompt: float | None = None
    mean_output: float | None = None


@dataclass(frozen=True)
class EngineFacts:
    """What the advice knows of the engines: their latency model, and today's budget."""

    shape: EngineShape | None
    budget: int | None
    model_profile: str | None
    gpu: str
    network: str = "ib400"
    """The link a split's KV cache would cross (for the `disagg plan` command)."""


@dataclass(frozen=True)
class Budget:
    tokens: int
    mixed_step: float
    """Seconds of one step carrying a chunk of this size and the running batch."""
    long_prompt_ttft: float
    """Seconds to prefill the long prompt in chunks of this size, beside that batch."""


@dataclass(frozen=True)
class NextStep:
    action: Action
    text: str
    budget: Budget | None = None
    command: str | None = None


def chunked_prefill(
    shape: EngineShape, tokens: int, long_prompt: int, running: int, context: int
) -> Budget:
    """A budget's mixed step and the long prompt's prefill time, beside ``running`` sequences
    of ``context`` tokens each."""
    contexts = [context] * max(1, running)
    done, ttft, longest = 0, 0.0, 0.0
    while done < long_prompt:
        chunk = min(tokens, long_prompt - done)
        step = step_time(shape, [PrefillChunk(chunk, done)], contexts)
        ttft += step
        longest = max(longest, step)
        done += chunk
    return Budget(tokens, longest, ttft)


def best_budget(
    shape: EngineShape, slo: Slo, long_prompt: int, running: int, context: int
) -> tuple[Budget | None, list[Budget]]:
    """The largest budget meeting both SLOs (None if none does), and every budget tried."""
    tried = [chunked_prefill(shape, b, long_prompt, running, context) for b in BUDGETS]
    fitting = [
        b for b in tried
        if b.mixed_step <= TPOT_MARGIN * slo.tpot and b.long_prompt_ttft <= TTFT_MARGIN * slo.ttft
    ]  # fmt: skip
    return (fitting[-1] if fitting else None), tried


def plan_command(facts: EngineFacts, traffic: Traffic, slo: Slo) -> str:
    """`disagg plan` for the traffic observed (flags it could not measure are left out)."""
    argv = ["disagg", "plan", "--model", facts.model_profile or "MODEL_PROFILE"]
    argv += ["--gpu", facts.gpu, "--network", facts.network]
    if traffic.rate:
        argv += ["--rate", f"{traffic.rate:.3g}"]
    if traffic.mean_prompt:
        argv += ["--input-tokens", str(round(traffic.mean_prompt))]
    if traffic.mean_output:
        argv += ["--output-tokens", str(round(traffic.mean_output))]
    argv += ["--ttft", f"{slo.ttft:g}", "--tpot", f"{slo.tpot:g}"]
    return shlex.join(argv)


def _interference(
    finding: Finding, timeline: Timeline, slo: Slo, facts: EngineFacts, traffic: Traffic
) -> NextStep:
    if timeline.mode == "disaggregated":
        return NextStep(
            "local-prefill",
            "the decode pool prefills short or mostly cached prompts itself: lower "
            "spec.router.prefillThresholdTokens and spec.router.localPrefill.maxUncachedTokens "
            "(0 sends every prompt through the prefill pool)",
        )
    command = plan_command(facts, traffic, slo)
    if facts.shape is None:
        return NextStep(
            "chunk",
            "lower the chunked-prefill budget (maxNumBatchedTokens); give --model-profile and "
            f"--gpu for a suggested value, or plan a split: {command}",
            command=command,
        )
    longest_seen = max((s.mean_prompt or 0.0) for s in finding.spikes)
    long_prompt = round(max(traffic.p99_prompt or 0.0, longest_seen, 1.0))
    running = math.ceil(max(s.running / max(1, s.decode_pods) for s in finding.spikes))
    context = round((traffic.mean_prompt or long_prompt) + (traffic.mean_output or 0.0) / 2)
    budget, _ = best_budget(facts.shape, slo, long_prompt, running, context)
    if budget is not None and (facts.budget is None or budget.tokens < facts.budget):
        now = f" (now {facts.budget})" if facts.budget else ""
        return NextStep(
            "chunk",
            f"set spec.{DisaggregatedModelSpec.pool_field(timeline.decoding_role)}"
            f".maxNumBatchedTokens to {budget.tokens}{now}: "
            f"a mixed step then takes {budget.mixed_step * 1000:.0f} ms against the "
            f"{slo.tpot * 1000:.0f} ms TPOT SLO, and a {long_prompt}-token prompt prefills in "
            f"{budget.long_prompt_ttft:.2f} s (the engine simulator's latency model, "
            f"{running} running sequences of {context} tokens)",
            budget=budget,
            command=command,
        )
    return NextStep(
        "disaggregate",
        f"no chunked-prefill budget keeps a mixed step under {TPOT_MARGIN:.0%} of the TPOT SLO "
        f"while a {long_prompt}-token prompt prefills within {TTFT_MARGIN:.0%} of the TTFT "
        f"SLO: disaggregate; size it with `{command}`",
        command=command,
    )


def next_step(
    finding: Finding, timeline: Timeline | None, slo: Slo, facts: EngineFacts, traffic: Traffic
) -> NextStep:
    """What to do about a finding."""
    if finding.verdict == "not-enough-data":
        return NextStep("collect", "nothing to decide yet: " + finding.summary.split(": ", 1)[-1])
    if finding.verdict == "healthy" or timeline is None:
        return NextStep("none", "nothing to change")
    if finding.verdict == "interference":
        return _interference(finding, timeline, slo, facts, traffic)
    if finding.verdict == "overload":
        role = finding.overloaded_role or timeline.decoding_role
        return NextStep(
            "scale",
            f"add {role} replicas: raise spec.{role}.replicas, or spec.{role}.autoscaling."
            "maxReplicas if the autoscaler is at its cap (chunking or splitting does not help "
            "a pool that is too small)",
        )
    return NextStep(
        "look",
        "TPOT misses its SLO for a reason these metrics do not show: look at the engines' "
        "logs, host load, and KV-transfer errors (`kubectl describe dm`)",
    )
