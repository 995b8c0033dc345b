"""The simulated engine's event loop: runs scheduler steps in (scaled) real time.

Each step lasts its modelled duration times ``time_scale`` and then hands every emitted
token to the request's queue. Requests record their own timings; latencies reported anywhere
are divided by ``time_scale`` so they read as real-GPU seconds.

The times recorded are the engine's own (:class:`Timeline`), not when the host happened to
wake the loop: on a busy host a wake-up comes late, which delays delivery but not what the
engine reports in its metrics, as on a real GPU whose steps do not wait for a CPU. How late
the host wakes it is measured (``disagg_sim_host_lag_seconds``) so a test can tell a busy
host from a slow engine.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from disagg.perf.roofline import EngineShape, NetworkProfile, transfer_time
from disagg.routing.tokens import continuation, output_token
from disagg.sim.kvchannel import KvLender, KvPending, KvUnknown, fetch
from disagg.sim.metrics import EngineMetrics
from disagg.sim.prefix_cache import DEFAULT_BLOCK_SIZE, PrefixCache, block_hashes, prompt_units
from disagg.sim.scheduler import Scheduler, SimRequest, Step

EngineRole = Literal["prefill", "decode", "both"]

MAX_CATCH_UP: Final = 2.0
"""Wall seconds the timeline may fall behind the host clock. A host that starves the
simulator for longer is not absorbed: the timeline restarts at the present, and the delay
shows in latencies (and in disagg_sim_host_lag_seconds)."""


@dataclass
class Timeline:
    """When each step starts and ends on the engine's own clock (wall seconds, monotonic).

    A step starts where the previous one ended while work was left over, or when new work
    arrived after the engine went idle; it ends its modelled duration later. A request joins
    the first step that starts after it was queued, so a host that wakes the loop late
    neither delays a running request's next token nor lets a newcomer into a step that began
    before it arrived. Only when the host runs more than MAX_CATCH_UP behind does the
    timeline move to the present.
    """

    free_at: float = -math.inf
    busy: bool = False
    """Work was left when the last step ended: the next step follows it at once."""
    arrived: float | None = None
    """The earliest time new work arrived while the engine was idle."""

    def notify(self, now: float) -> None:
        if not self.busy and self.arrived is None:
            self.arrived = now

    def start(self, now: float) -> float:
        """The start of a step planned at ``now``."""
        arrived = now if self.arrived is None else self.arrived
        begin = self.free_at if self.busy else max(self.free_at, arrived)
        self.arrived = None
        return self.caught_up(now, begin)

    @staticmethod
    def caught_up(now: float, begin: float) -> float:
        """``begin``, unless the host is more than MAX_CATCH_UP behind it: then the present."""
        return now if now - begin > MAX_CATCH_UP else begin

    def finish(self, end: float, work_left: bool) -> None:
        self.free_at, self.busy = end, work_left
        if not work_left:
            self.arrived = None

    def idle(self) -> None:
        """Nothing could be scheduled: the next step starts when new work arrives."""
        self.busy, self.arrived = False, None


@dataclass
class Faults:
    """Injected faults, settable by flags and at run time through /admin/faults."""

    added_latency_ms: float = 0.0
    error_rate: float = 0.0
    crash_after: int | None = None


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes one simulated engine."""

    served_model_name: str
    role: EngineRole
    shape: EngineShape
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_capacity_tokens: int
    time_scale: float
    network: NetworkProfile
    kv_bytes_scale: float = 1e-4
    kv_lease_seconds: float = 30.0
    advertise_host: str = "127.0.0.1"
    kv_port: int = 0
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    prefix_caching: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE
    histogram_buckets: Mapping[str, Sequence[float]] = field(default_factory=dict)
    """vLLM's ``--custom-histogram-buckets``: bounds by family that replace the defaults."""


@dataclass
class Timings:
    """Marks of one request on the engine's timeline (time.monotonic() seconds)."""

    arrival: float
    queued: float = -math.inf
    """When the engine queued it (after a decode engine's KV fetch); it joins the first step
    that starts after this."""
    scheduled: float | None = None
    tokens: list[float] = field(default_factory=list)


class Engine:
    """A scheduler driven in real time, with metrics and the KV side channel."""

    def __init__(self, config: EngineConfig, faults: Faults | None = None) -> None:
        self.config = config
        self.faults = faults or Faults()
        cache = (
            PrefixCache(config.kv_capacity_tokens // config.block_size)
            if config.prefix_caching
            else None
        )
        self.scheduler = Scheduler(
            config.shape,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.kv_capacity_tokens,
            prefix_cache=cache,
            block_size=config.block_size,
        )
        self.metrics = EngineMetrics(config.served_model_name, config.histogram_buckets)
        self.lender = KvLender(config.kv_lease_seconds * config.time_scale, self._release_held)
        self.kv_port = config.kv_port
        self.accepted = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=64)
        self._queues: dict[int, asyncio.Queue[float | None]] = {}
        self._timings: dict[int, Timings] = {}
        self._arrivals: deque[tuple[float, SimRequest]] = deque()
        """Requests queued but not yet handed to the scheduler, with when they were queued."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._block_counter = 0
        self._rng = random.Random()
        self.timeline = Timeline()

    async def start(self, kv_host: str) -> None:
        self.kv_port = await self.lender.start(kv_host, self.config.kv_port)
        self._task = asyncio.create_task(self._run(), name="engine loop")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.lender.close()

    def _wake_up(self) -> None:
        self.timeline.notify(time.monotonic())
        self._wake.set()

    def _release_held(self, tokens: int) -> None:
        self.scheduler.release_held(tokens)
        self._wake_up()

    def seconds(self, wall: float) -> float:
        """Wall seconds as simulated GPU seconds."""
        return wall / self.config.time_scale

    def should_fail(self) -> bool:
        return self.faults.error_rate > 0 and self._rng.random() < self.faults.error_rate

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self.lender.expire()
            now = time.monotonic()
            start = self.timeline.start(now)
            step = self._plan(start)
            if step.tokens == 0 and self._arrivals:
                # Nothing that had arrived by then could run: the step starts with the next.
                start = self.timeline.caught_up(now, max(start, self._arrivals[0][0]))
                step = self._plan(start)
            self._publish_gauges()
            if step.tokens == 0:
                self._hand_over(math.inf)  # whatever step comes next starts after all of them
                self.timeline.idle()
                self._wake.clear()
                continue
            requests = [r for r, _ in step.chunks] + step.decodes
            for timing in map(self._timings.get, map(id, requests)):
                if timing is not None and timing.scheduled is None:
                    timing.scheduled = start
            duration = self.scheduler.duration(step) + self.faults.added_latency_ms / 1000
            end = start + duration * self.config.time_scale
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            self.metrics.host_lag.observe(max(0.0, time.monotonic() - end))
            result = self.scheduler.complete(step)
            self.timeline.finish(end, self.scheduler.has_work() or bool(self._arrivals))
            for request, _ in result.emitted:
                queue = self._queues.get(id(request))
                if queue is not None:
                    queue.put_nowait(end)
            for request in result.finished:
                if request.hold_kv:
                    nbytes = int(
                        request.prompt_tokens
                        * self.config.shape.kv_bytes_per_token
                        * self.config.kv_bytes_scale
                    )
                    self.lender.lend(request.id, request.prompt_tokens, max(1, nbytes))
                queue = self._queues.get(id(request))
                if queue is not None:
                    queue.put_nowait(None)
            self._publish_gauges()

    def _plan(self, start: float) -> Step:
        """The step starting at ``start``: the scheduler gets every request queued by then."""
        self._hand_over(start)
        return self.scheduler.plan()

    def _hand_over(self, queued_by: float) -> None:
        while self._arrivals and self._arrivals[0][0] <= queued_by:
            self.scheduler.add(self._arrivals.popleft()[1])

    def _publish_gauges(self) -> None:
        s = self.scheduler
        waiting = len(s.waiting) + len(self._arrivals)
        self.metrics.observe_gauges(len(s.running), waiting, s.usage)
        self.metrics.observe_prefix_cache(s.prefix_queries, s.prefix_hits)

    def block_ids(self, prompt_tokens: int) -> list[list[int]]:
        """Opaque KV block ids, as a prefill engine reports them to the router."""
        count = max(1, -(-prompt_tokens // 16))
        start = self._block_counter
        self._block_counter += count
        return [list(range(start, start + count))]

    def cached_tokens(self, block_hashes: tuple[bytes, ...]) -> int:
        """Prompt tokens whose KV this engine's prefix cache holds already."""
        cache = self.scheduler.prefix_cache
        if cache is None:
            return 0
        return cache.cached_prefix(block_hashes) * self.config.block_size

    def cache_answer(self, body: dict[str, Any], request_id: str, generated: int) -> None:
        """Keep a finished answer's KV as the conversation's next turn would begin (vLLM keeps
        generated tokens' blocks): the chat with the answer as the assistant message, or the
        text prompt followed by it."""
        cache = self.scheduler.prefix_cache
        if cache is None:
            return
        answer = "".join(output_token(request_id, i) for i in range(generated))
        follow_up = continuation(body, answer)
        if follow_up is not None:
            cache.insert(block_hashes(prompt_units(follow_up), self.config.block_size))

    async def load_remote_kv(
        self, host: str, port: int, request_id: str, prompt_tokens: int, cached_tokens: int = 0
    ) -> None:
        """Pull the prompt KV from a prefill engine, less what the prefix cache holds, taking
        the modelled transfer time; the bytes a real engine would move go to vLLM's
        ``nixl_bytes_transferred`` and the modelled time to ``nixl_xfer_time_seconds`` (a full hit
        moves none and observes nothing, as there)."""
        started = time.monotonic()
        moved = max(0, prompt_tokens - cached_tokens)
        await fetch(host, port, request_id, read_timeout=30.0, cached_tokens=cached_tokens)
        if moved == 0:
            return
        self.metrics.nixl_bytes.labels(**self.metrics.labels).observe(
            moved * self.config.shape.kv_bytes_per_token
        )
        modelled = transfer_time(self.config.shape, moved, self.config.network)
        self.metrics.nixl_xfer_time.labels(**self.metrics.labels).observe(modelled)
        remaining = modelled * self.config.time_scale - (time.monotonic() - started)
        if remaining > 0:
            await asyncio.sleep(remaining)

    async def wait_remote_kv(
        self,
        host: str,
        port: int,
        request_id: str,
        prompt_tokens: int,
        deadline_seconds: float = 300.0,
    ) -> None:
        """SGLang decode: poll the prefill engine's bootstrap server until the KV is ready.

        The router sends the request to both engines at once, so the decode side may ask
        before the prefill side has even seen the room; like SGLang's decode, it waits for
        the room to appear instead of failing.
        """
        deadline = time.monotonic() + deadline_seconds * self.config.time_scale
        while True:
            try:
                await self.load_remote_kv(host, port, request_id, prompt_tokens)
                return
            except (KvPending, KvUnknown):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.005)

    async def run(self, request: SimRequest, arrival: float) -> AsyncGenerator[float, None]:
        """Schedule a request and yield the time of each of its tokens (on the timeline)."""
        queue: asyncio.Queue[float | None] = asyncio.Queue()
        self.scheduler.check(request)
        timing = Timings(arrival=arrival, queued=time.monotonic())
        self._queues[id(request)] = queue
        self._timings[id(request)] = timing
        self._arrivals.append((timing.queued, request))
        self._wake_up()
        self.accepted += 1
        finished = False
        try:
            while True:
                emitted = await queue.get()
                if emitted is None:
                    finished = True
                    break
                self._observe_token(timing, emitted)
                yield emitted
        finally:
            if not finished:
                self._cancel(request)
                self._wake_up()
            else:
                self._record(request, timing)
            self._queues.pop(id(request), None)
            self._timings.pop(id(request), None)

    def _cancel(self, request: SimRequest) -> None:
        pending = [entry for entry in self._arrivals if entry[1] is request]
        if pending:
            request.cancelled = True
            self._arrivals.remove(pending[0])
        else:
            self.scheduler.cancel(request)

    def _observe_token(self, timing: Timings, emitted: float) -> None:
        """TTFT and inter-token latency as each token comes (vLLM observes them per
        iteration, so an aborted request's tokens count too)."""
        m, labels = self.metrics, self.metrics.labels
        if timing.tokens:
            gap = self.seconds(emitted - timing.tokens[-1])
            m.itl.labels(**labels).observe(gap)
            m.fine_itl.labels(**labels).observe(gap)
        else:
            m.ttft.labels(**labels).observe(self.seconds(emitted - timing.arrival))
        timing.tokens.append(emitted)

    def _record(self, request: SimRequest, timing: Timings) -> None:
        """What vLLM observes when a request finishes."""
        m, labels = self.metrics, self.metrics.labels
        tokens = timing.tokens
        if not tokens:
            return
        end = tokens[-1]
        ttft = self.seconds(tokens[0] - timing.arrival)
        e2e = self.seconds(end - timing.arrival)
        tpot = (e2e - ttft) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
        m.tpot.labels(**labels).observe(tpot)
        m.e2e.labels(**labels).observe(e2e)
        if timing.scheduled is not None:
            m.queue.labels(**labels).observe(self.seconds(timing.scheduled - timing.arrival))
            # vLLM's prefill phase: from first scheduled to the first token.
            m.prefill.labels(**labels).observe(self.seconds(tokens[0] - timing.scheduled))
        m.prompt_tokens.labels(**labels).inc(request.prompt_tokens)
        m.prompt_lengths.labels(**labels).observe(request.prompt_tokens)
        m.generation_tokens.labels(**labels).inc(len(tokens))
