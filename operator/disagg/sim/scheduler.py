"""A continuous-batching scheduler in the style of vLLM v1 (pure: no clock, no I/O).

Each step takes every running request once: a decoding request adds one token, a request
still prefilling adds its next prompt chunk. What is left of the token budget
(``max_num_batched_tokens``) admits waiting requests, first come first served, while
``max_num_seqs`` and the KV-cache capacity allow. A request whose prompt KV arrived from a
remote prefill engine skips the prefill compute. The step's duration comes from the latency
model, so one long prompt in a step stretches the inter-token gap of every decode in it.

With ``prefill_first`` it schedules like vLLM before chunked prefill (the baseline DistServe
measured): whenever prompts wait, a step runs only whole prompts and every decode pauses.
With a :class:`~disagg.sim.prefix_cache.PrefixCache`, an admitted request computes only
the part of its prompt after the leading blocks already cached.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from disagg.perf.roofline import EngineShape, PrefillChunk, step_time
from disagg.sim.prefix_cache import PrefixCache


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine."""

    id: str
    prompt_tokens: int
    max_tokens: int
    kv_ready: bool = False
    """The prompt's KV came from a remote prefill engine: no prefill compute here."""
    hold_kv: bool = False
    """Keep the prompt's KV after finishing (a prefill engine lending it to a decode engine)."""
    block_hashes: tuple[bytes, ...] = ()
    """Its prompt's full blocks, for the prefix cache."""
    prefilled: int = 0
    generated: int = 0
    finished: bool = False
    cancelled: bool = False

    @property
    def prefill_done(self) -> bool:
        return self.kv_ready or self.prefilled >= self.prompt_tokens

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def kv_reservation(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass
class Step:
    """What one engine step computes."""

    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)
    decodes: list[SimRequest] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.chunks) + len(self.decodes)


@dataclass
class StepResult:
    """Tokens emitted by a step: (request, index of the token) and requests that finished."""

    emitted: list[tuple[SimRequest, int]] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)


class Scheduler:
    """Holds waiting and running requests and plans one step at a time."""

    def __init__(
        self,
        shape: EngineShape,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        kv_capacity_tokens: int,
        prefill_first: bool = False,
        prefix_cache: PrefixCache | None = None,
        block_size: int = 16,
    ) -> None:
        self.shape = shape
        self.prefill_first = prefill_first
        self.budget = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.kv_capacity = kv_capacity_tokens
        self.kv_used = 0
        self.kv_held = 0
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix_cache = prefix_cache
        self.block_size = block_size
        self.prefix_queries = 0
        """Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)."""
        self.prefix_hits = 0
        """Of those, tokens found cached (vLLM's prefix_cache_hits)."""

    def check(self, request: SimRequest) -> None:
        """Refuse a request that could never fit this engine's KV cache."""
        if request.kv_reservation > self.kv_capacity:
            raise ValueError(
                f"request needs {request.kv_reservation} KV tokens; this engine holds "
                f"{self.kv_capacity}"
            )

    def add(self, request: SimRequest) -> None:
        self.check(request)
        self.waiting.append(request)

    def cancel(self, request: SimRequest) -> None:
        """Drop a request (its client went away); its KV is freed at once."""
        request.cancelled = True
        if request in self.waiting:
            self.waiting.remove(request)
        elif request in self.running:
            self.running.remove(request)
            self.kv_used -= request.kv_reservation
            self._unpin(request)

    def release_held(self, tokens: int) -> None:
        """Free KV that a prefill engine held for a decode engine (fetched or expired)."""
        self.kv_held = max(0, self.kv_held - tokens)

    @property
    def usage(self) -> float:
        if self.kv_capacity <= 0:
            return 0.0
        return min(1.0, (self.kv_used + self.kv_held) / self.kv_capacity)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def plan(self) -> Step:
        """The next step: every running request, then waiting ones while room remains."""
        if self.prefill_first:
            prompts = self._plan_whole_prompts()
            if prompts.chunks:
                return prompts
            return Step(decodes=[r for r in self.running if r.prefill_done])
        step = Step()
        budget = self.budget
        for request in self.running:
            if request.prefill_done:
                step.decodes.append(request)
                budget -= 1
        for request in self.running:
            if not request.prefill_done and budget > 0:
                chunk = min(budget, request.prompt_tokens - request.prefilled)
                step.chunks.append((request, chunk))
                budget -= chunk
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.kv_used + self.kv_held + request.kv_reservation > self.kv_capacity:
                break
            if not request.kv_ready and budget <= 0:
                break
            self._admit(self.waiting.popleft())
            if request.kv_ready:
                step.decodes.append(request)
                budget -= 1
            else:
                chunk = min(budget, request.prompt_tokens - request.prefilled)
                step.chunks.append((request, chunk))
                budget -= chunk
        return step

    def _admit(self, request: SimRequest) -> None:
        """Move a waiting request to running: reserve its KV, reuse its cached prefix."""
        self.running.append(request)
        self.kv_used += request.kv_reservation
        if self.prefix_cache is None or not request.block_hashes:
            return
        cached = self.prefix_cache.acquire(request.block_hashes) * self.block_size
        if not request.kv_ready:
            self.prefix_queries += request.prompt_tokens
            self.prefix_hits += cached
            # Like vLLM, the last prompt token is computed even when all of it is cached.
            request.prefilled = min(cached, request.prompt_tokens - 1)

    def _unpin(self, request: SimRequest) -> None:
        if self.prefix_cache is not None and request.block_hashes:
            self.prefix_cache.release(request.block_hashes)

    def _plan_whole_prompts(self) -> Step:
        step = Step()
        budget = self.budget
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.kv_used + self.kv_held + request.kv_reservation > self.kv_capacity:
                break
            if not request.kv_ready and step.chunks and request.prompt_tokens > budget:
                break
            self._admit(self.waiting.popleft())
            if not request.kv_ready:
                chunk = request.prompt_tokens - request.prefilled
                step.chunks.append((request, chunk))
                budget -= chunk
        return step

    def duration(self, step: Step) -> float:
        """Model seconds the step takes."""
        chunks = [PrefillChunk(n, r.prefilled) for r, n in step.chunks]
        return step_time(self.shape, chunks, [r.context for r in step.decodes])

    def complete(self, step: Step) -> StepResult:
        """Apply a finished step: advance prompts, emit one token per sampling request."""
        result = StepResult()
        sampling: list[SimRequest] = []
        for request, n in step.chunks:
            if request.cancelled:
                continue
            request.prefilled += n
            if request.prefill_done:
                sampling.append(request)  # the step that ends a prompt samples its first token
        sampling += [r for r in step.decodes if not r.cancelled]
        for request in sampling:
            result.emitted.append((request, request.generated))
            request.generated += 1
            if request.generated >= request.max_tokens:
                request.finished = True
                result.finished.append(request)
                self.running.remove(request)
                self.kv_used -= request.kv_reservation
                self._unpin(request)
                if request.hold_kv:
                    self.kv_held += request.prompt_tokens
        return result
