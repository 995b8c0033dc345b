"""A discrete-event simulator of a whole deployment (deterministic, no wall clock).

Every engine is the same continuous-batching :class:`~disagg.sim.scheduler.Scheduler` the
engine simulator runs, timed by the same latency model, so the fleet and a single engine
agree by construction. Colocated mode runs prompt and generation in one pool (chunked
prefill under the token budget); disaggregated mode runs prompts in a prefill pool, moves the
KV cache over the network (its transfer time follows the model's KV bytes per token), then
generates in a decode pool. Requests are routed as the router routes them: a prompt under
the pd threshold goes straight to decode, a short one is offloaded to a decode engine
while the prefill pool is backed up (the router's own rule and wait estimate,
:mod:`disagg.routing.offload`), and the rest go to the prefill engine with the fewest prompt
tokens in flight (:func:`disagg.routing.affinity.least_work`). An autoscaling policy can
resize the pools every interval; new replicas serve after a provisioning delay, removed ones
drain first.

Speed: a decode-only step changes nothing anyone else sees until a request finishes, a new
request reaches the engine, or the policy looks. So an engine runs consecutive decode-only
steps as one event (each step still timed by the latency model, at its own context) and a
dispatch to the engine cuts the run at the next step boundary: the results are the same as
stepping one by one.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final

from disagg.perf.fitted import decode_step_model
from disagg.perf.roofline import (
    EngineShape,
    NetworkProfile,
    PrefillChunk,
    kv_capacity_tokens,
    transfer_time,
)
from disagg.routing.affinity import least_work
from disagg.routing.offload import PrefillBacklog
from disagg.sim.fleet_stats import pool_stats
from disagg.sim.fleet_types import (
    Engine,
    FleetConfig,
    Mode,
    PoolName,
    PoolStats,
    ScalingPolicy,
    pools_of,
)
from disagg.sim.results import Outcome, Result
from disagg.sim.scheduler import Scheduler, SimRequest, Step
from disagg.sim.traffic import Request

__all__ = [
    "Engine",
    "Fleet",
    "FleetConfig",
    "Mode",
    "PoolName",
    "PoolStats",
    "ScalingPolicy",
    "pools_of",
    "simulate",
]

RUN_LOOKAHEAD: Final = 8


class Fleet:
    """The event loop."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._decode_step = decode_step_model(config.step_time)
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.engines: list[Engine] = []
        self.outcomes: dict[int, Outcome] = {}
        self.actions = 0
        self.scaling_log: list[tuple[float, str, int, int]] = []
        self.timeline: list[dict[str, float]] = []
        self._end = self._horizon = math.inf
        self._arrived: list[Outcome] = []
        self._arrivals: list[float] = []
        """Outcomes and arrival times in arrival order: the policy's window is a slice."""
        self._owners: dict[int, tuple[Engine, Outcome]] = {}
        self._served: dict[PoolName, list[tuple[float, int]]] = {"prefill": [], "decode": []}
        """(time, prompt tokens) of every request a pool finished, in time order."""
        self._observed: dict[tuple[PoolName, str], list[tuple[float, float]]] = {
            (pool, slo): [] for pool in ("prefill", "decode") for slo in ("ttft", "tpot")
        }
        """(time, value) of each TTFT and time per output token a pool's engines observed, as
        their histograms count them: when the first token is out, when the request is done."""
        self._generated: dict[PoolName, int] = {"prefill": 0, "decode": 0}
        """Output tokens each pool's engines emitted so far: their generation-token counter."""
        self._generated_seen: dict[PoolName, list[tuple[float, int]]] = {
            "prefill": [],
            "decode": [],
        }
        """(time, that counter) at the evaluations of the last rate window."""
        self.pools = pools_of(config.mode)
        self._backlog = PrefillBacklog()
        """What the router knows of each prefill engine's queue (for offloading)."""
        self._room = {
            pool: kv_capacity_tokens(self._shape(pool if pool in self.pools else "decode"))
            for pool in ("prefill", "decode")
        }
        """Tokens one engine's KV cache holds: a prefill engine holds the prompt, a decode
        (or colocated) engine the prompt and the output."""
        for pool in self.pools:
            for _ in range(config.replicas[pool]):
                self._add_engine(pool, ready_at=0.0)

    def _shape(self, pool: PoolName) -> EngineShape:
        if pool == "prefill" and self.config.prefill_shape is not None:
            return self.config.prefill_shape
        return self.config.shape

    def _add_engine(self, pool: PoolName, ready_at: float) -> None:
        shape = self._shape(pool)
        scheduler = Scheduler(
            shape,
            self.config.budget[pool],
            self.config.max_num_seqs,
            kv_capacity_tokens(shape),
            prefill_first=self.config.mode == "colocated" and not self.config.chunked_prefill,
        )
        self.engines.append(Engine(pool, scheduler, ready_at, f"{pool}-{len(self.engines)}"))

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (time, next(self._seq), action))

    def _serving(self, pool: PoolName) -> list[Engine]:
        return [
            e
            for e in self.engines
            if e.pool == pool and not e.draining and e.removed_at is None and e.ready_at <= self.now
        ]

    def _dispatch(
        self, pool: PoolName, sim: SimRequest, outcome: Outcome, engine: Engine | None = None
    ) -> None:
        engines = self._serving(pool)
        if not engines:  # nothing serves yet (all provisioning): retry shortly, as a router would
            self.at(self.now + 1.0, lambda: self._dispatch(pool, sim, outcome))
            return
        if engine is None and pool == "prefill" and self.config.mode == "disaggregated":
            # As the router does: the prefill engine with the fewest prompt tokens in flight.
            name = least_work(
                [(e.name, e.outstanding) for e in engines],
                {e.name: float(self._backlog.in_flight(e.name)) for e in engines},
            )
            engine = next(e for e in engines if e.name == name)
        # Ties go to the oldest engine (min keeps list order); never to a memory address.
        engine = engine or min(engines, key=lambda e: e.outstanding)
        engine.outstanding += 1
        if pool == "prefill" and self.config.mode == "disaggregated":
            self._backlog.sent(engine.name, sim.prompt_tokens, self.now)
        self._owners[id(sim)] = (engine, outcome)
        engine.scheduler.waiting.append(sim)
        if engine.busy and len(engine.run_ends) > 1:
            self._cut_run(engine)
        self._kick(engine)

    def _kick(self, engine: Engine) -> None:
        if engine.busy:
            return
        step = engine.scheduler.plan()
        if step.tokens == 0:
            return
        engine.busy = True
        for request, _ in step.chunks:
            if request.prefilled == 0:
                owner = self._owners.get(id(request))
                if owner is not None and owner[1].prefill_started is None:
                    owner[1].prefill_started = self.now
        duration = self.config.step_time(
            engine.scheduler.shape,
            [PrefillChunk(n, r.prefilled) for r, n in step.chunks],
            [r.context for r in step.decodes],
        )
        engine.run_ends = [self.now + duration]
        if not step.chunks and not engine.scheduler.waiting:
            self._extend_decode_run(engine, step)
        self._schedule_run(engine, step)

    def _extend_decode_run(self, engine: Engine, step: Step) -> None:
        """Add decode-only steps until a request finishes or the policy looks."""
        if any(r.generated == 0 for r in step.decodes):
            return  # a first token is an event the outcome must record at its own time
        # Capped: a dispatch cuts the run, and steps computed past the cut are wasted work.
        steps = min(RUN_LOOKAHEAD, *(r.max_tokens - r.generated for r in step.decodes))
        # A decode step's time depends on the batch size and the total context only.
        batch = len(step.decodes)
        context = sum(r.context for r in step.decodes)
        ends = engine.run_ends
        shape = engine.scheduler.shape
        while len(ends) < steps:
            context += batch
            end = ends[-1] + self._decode_step(shape, batch, context)
            if end > self._horizon:
                return
            ends.append(end)

    def _schedule_run(self, engine: Engine, step: Step) -> None:
        engine.run_id += 1
        engine.run_step = step
        run_id, steps = engine.run_id, len(engine.run_ends)
        self.at(engine.run_ends[-1], lambda: self._finish_run(engine, steps, run_id))

    def _cut_run(self, engine: Engine) -> None:
        """A request arrived: end the decode run at the first step boundary from now."""
        keep = next(i for i, end in enumerate(engine.run_ends) if end >= self.now) + 1
        if keep < len(engine.run_ends) and engine.run_step is not None:
            del engine.run_ends[keep:]
            self._schedule_run(engine, engine.run_step)

    def _finish_run(self, engine: Engine, steps: int, run_id: int) -> None:
        step = engine.run_step
        if run_id != engine.run_id or step is None:
            return  # the run was cut short; a later event finishes it
        for request in step.decodes:
            request.generated += steps - 1
        self._finish_step(engine, step)

    def _finish_step(self, engine: Engine, step: Step) -> None:
        engine.busy = False
        result = engine.scheduler.complete(step)
        for sim, index in result.emitted:
            _, outcome = self._owners[id(sim)]
            if engine.pool == "prefill" and self.config.mode == "disaggregated":
                continue
            if index == 0:
                outcome.first_token = self.now
                self._observed[engine.pool, "ttft"].append(
                    (self.now, self.now - outcome.request.arrival)
                )
                if outcome.offloaded:  # its offload slot is free again
                    engine.local_prefills -= 1
            outcome.last_token = self.now
            self._generated[engine.pool] += max(0, index + 1 - outcome.tokens)
            outcome.tokens = index + 1
        for sim in result.finished:
            owner, outcome = self._owners.pop(id(sim))
            owner.outstanding -= 1
            self._served[owner.pool].append((self.now, sim.prompt_tokens))
            if outcome.tokens > 1 and (tpot := outcome.tpot) is not None:
                self._observed[owner.pool, "tpot"].append((self.now, tpot))
            if owner.pool == "prefill" and self.config.mode == "disaggregated":
                self._backlog.finished(owner.name, sim.prompt_tokens, self.now)
                outcome.prefill_done = self.now
                self._observed["prefill", "ttft"].append(
                    (self.now, self.now - outcome.request.arrival)
                )
                network = self.config.network
                delay = (
                    0.0
                    if network is None
                    else _transfer(self._shape("prefill"), sim.prompt_tokens, network)
                )
                decode = SimRequest(
                    sim.id, sim.prompt_tokens, outcome.request.output_tokens, kv_ready=True
                )
                self.at(
                    self.now + delay, functools.partial(self._dispatch, "decode", decode, outcome)
                )
        if engine.draining and engine.outstanding == 0 and not engine.scheduler.has_work():
            engine.removed_at = self.now
        self._kick(engine)

    def _arrive(self, index: int, request: Request) -> None:
        outcome = Outcome(request)
        self.outcomes[index] = outcome
        self._arrived.append(outcome)
        self._arrivals.append(request.arrival)
        decode_tokens = request.prompt_tokens + request.output_tokens
        if (
            request.prompt_tokens > self._room["prefill"]
            or decode_tokens > self._room["decode"]
            or decode_tokens > self.config.shape.model.max_context
        ):
            outcome.rejected = True  # it would wait for room that never comes, and block
            return
        whole = SimRequest(str(index), request.prompt_tokens, request.output_tokens)
        if self.config.mode == "colocated" or request.prompt_tokens < self.config.pd_threshold:
            self._dispatch("decode", whole, outcome)
            return
        offload_to = self._offload_target(request.prompt_tokens)
        if offload_to is not None:
            outcome.offloaded = True
            offload_to.local_prefills += 1
            self._dispatch("decode", whole, outcome, offload_to)
            return
        self._dispatch("prefill", SimRequest(str(index), request.prompt_tokens, 1), outcome)

    def _offload_target(self, prompt_tokens: int) -> Engine | None:
        """The decode engine that prefills this prompt itself, as the router decides, or None."""
        rule = self.config.offload
        if rule is None:
            return None
        prefill = [e.name for e in self._serving("prefill")]
        wait = self._backlog.least_wait(prefill, self.now)
        return rule.target(prompt_tokens, wait, self._serving("decode"), lambda e: e.outstanding)

    def _stats(self, pool: PoolName) -> PoolStats:
        since = self.now - self.config.window
        served = self._served[pool]
        observed = {}
        for slo in ("ttft", "tpot"):
            seen = self._observed[pool, slo]
            observed[slo] = seen[bisect.bisect_left(seen, (since, -math.inf)) :]
        stats = pool_stats(
            pool,
            self.config,
            self.now,
            self._arrived[bisect.bisect_left(self._arrivals, since) :],
            served[bisect.bisect_left(served, (since, -1)) :],
            observed,
            [e for e in self.engines if e.pool == pool and e.removed_at is None],
            self._serving(pool),
        )
        return replace(stats, generation_tokens_rate=self._generation_rate(pool, since))

    def _generation_rate(self, pool: PoolName, since: float) -> float:
        """Output tokens the pool generated per second since ``since`` (or since the oldest
        reading after it), as rate() reads the engines' counter."""
        seen = self._generated_seen[pool]
        seen.append((self.now, self._generated[pool]))
        while len(seen) > 1 and seen[1][0] <= since:
            seen.pop(0)
        (start, first), (_, last) = seen[0], seen[-1]
        return (last - first) / max(self.config.interval, self.now - start)

    def _scale(self, pool: PoolName, desired: int) -> None:
        low, high = self.config.bounds[pool]
        desired = max(low, min(high, desired))
        live = [
            e for e in self.engines if e.pool == pool and e.removed_at is None and not e.draining
        ]
        if desired != len(live):
            self.scaling_log.append((self.now, pool, len(live), desired))
        if desired > len(live):
            for _ in range(desired - len(live)):
                self._add_engine(pool, ready_at=self.now + self.config.provisioning_delay)
            self.actions += 1
        elif desired < len(live):
            for engine in sorted(live, key=lambda e: (e.ready_at <= self.now, e.outstanding))[
                : len(live) - desired
            ]:
                engine.draining = True
                if engine.outstanding == 0 and not engine.scheduler.has_work():
                    engine.removed_at = self.now
            self.actions += 1

    def _evaluate(self) -> None:
        sample: dict[str, float] = {"t": self.now}
        for pool in self.pools:
            stats = self._stats(pool)
            if self.config.policy is not None:
                self._scale(pool, self.config.policy.desired(pool, stats, self.now))
            sample[f"{pool}_replicas"] = len(
                [
                    e
                    for e in self.engines
                    if e.pool == pool and e.removed_at is None and not e.draining
                ]
            )
            sample[f"{pool}_ttft_p99"] = stats.ttft_p99 if stats.ttft_p99 is not None else math.nan
            sample[f"{pool}_tpot_p99"] = stats.tpot_p99 if stats.tpot_p99 is not None else math.nan
            sample["request_rate"] = stats.request_rate
        self.timeline.append(sample)
        if self._events:
            self.at(self.now + self.config.interval, self._evaluate)
            self._horizon = min(self._end, self.now + self.config.interval)
        else:
            self._horizon = self._end

    def run(self, requests: Sequence[Request], drain: float = 600.0) -> Result:
        """Play the requests; keep going up to ``drain`` seconds after the last arrival."""
        for index, request in enumerate(requests):
            self.at(request.arrival, functools.partial(self._arrive, index, request))
        self.at(0.0, self._evaluate)
        end = (requests[-1].arrival if requests else 0.0) + drain
        self._end = self._horizon = end
        while self._events and self._events[0][0] <= end:
            self.now, _, action = heapq.heappop(self._events)
            action()
        duration = max(self.now, requests[-1].arrival if requests else 0.0)
        by_pool: dict[str, float] = {}
        for engine in self.engines:
            gpus = self._shape(engine.pool).tp
            created = (
                max(0.0, engine.ready_at - self.config.provisioning_delay)
                if engine.ready_at > 0
                else 0.0
            )
            gone = engine.removed_at if engine.removed_at is not None else duration
            by_pool[engine.pool] = by_pool.get(engine.pool, 0.0) + max(0.0, gone - created) * gpus
        ordered = [self.outcomes[i] for i in sorted(self.outcomes)]
        return Result(
            ordered, duration, sum(by_pool.values()), self.actions, self.timeline,
            self.scaling_log, by_pool,
        )  # fmt: skip


def _transfer(shape: EngineShape, tokens: int, network: NetworkProfile) -> float:
    return transfer_time(shape, tokens, network)


def simulate(config: FleetConfig, requests: Sequence[Request], drain: float = 600.0) -> Result:
    """Run one deployment against one request stream."""
    return Fleet(config).run(requests, drain)
