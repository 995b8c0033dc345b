"""The demo while it plays: a sampler of pools and status once a second, and the live view
(a rich panel on a terminal, one status line per interval without one)."""

from __future__ import annotations

import logging
import threading
import time

from disagg.demo.load import MODEL
from disagg.demo.report import Sample, show_millis, show_seconds
from disagg.demo.stack import COLOCATED_MODEL, Stack
from disagg.demo.story import Phase


class Recorder:
    """Samples replicas and the model status once a second; feeds the view and the report."""

    def __init__(self, loop: Stack) -> None:
        self.loop = loop
        self.phase = ""
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self.status_line = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> Sample:
        model = self.loop.model()
        status = model.get("status", {})
        metrics = status.get("metrics", {})
        ready = {r: int(status.get(r, {}).get("readyReplicas", 0)) for r in ("prefill", "decode")}
        reasons = [status.get(r, {}).get("lastScaleReason") for r in ("prefill", "decode")]
        times = [status.get(r, {}).get("lastScaleTime") or "" for r in ("prefill", "decode")]
        latest = max(range(2), key=lambda i: times[i])
        reason = (
            f"{('prefill', 'decode')[latest]}: {reasons[latest]}"
            if reasons[latest]
            else "no scaling yet"
        )
        names = [MODEL] + ([COLOCATED_MODEL] if self.loop.colocated_router else [])
        self.status_line = self.loop.kube.run(
            "get", "dm", *names, "-n", self.loop.namespace, check=False
        ).stdout.strip()
        sample = Sample(
            time.monotonic() - self.started,
            self.phase,
            self.loop.replicas(),
            ready,
            metrics.get("ttftP99Seconds"),
            metrics.get("tpotP99Seconds"),
            reason,
            budget=(status.get("sloBudget") or {}).get("summary"),
        )
        if self.loop.colocated_router is not None:
            status = self.loop.model(COLOCATED_MODEL).get("status", {})
            sample.ready["engine"] = int(status.get("engine", {}).get("readyReplicas", 0))
            seen = status.get("metrics", {})
            sample.colocated_ttft_p99 = seen.get("ttftP99Seconds")
            sample.colocated_tpot_p99 = seen.get("tpotP99Seconds")
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._sample())
            except (AssertionError, OSError, ValueError) as error:
                logging.getLogger("disagg.demo").debug("sample failed: %r", error)
            self._stop.wait(1.0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def line(recorder: Recorder, phase: Phase, rate: float) -> str:
    s = recorder.samples[-1] if recorder.samples else None
    if s is None:
        return f"[{phase.name}] starting"
    ttft, tpot = show_seconds(s.ttft_p99), show_millis(s.tpot_p99)
    colocated = ""
    if "engine" in s.replicas:
        colocated = (
            f"  | colocated engine {s.ready.get('engine', 0)}/{s.replicas['engine']} "
            f"TTFT p99 {show_seconds(s.colocated_ttft_p99)} "
            f"TPOT p99 {show_millis(s.colocated_tpot_p99)}"
        )
    return (
        f"t={s.t:5.0f}s [{phase.name:<12}] prefill {s.ready['prefill']}/{s.replicas['prefill']} "
        f"decode {s.ready['decode']}/{s.replicas['decode']}  TTFT p99 {ttft}  TPOT p99 {tpot}  "
        f"budget {s.budget or '-'}  load {rate:g} req/s  last: {s.reason}{colocated}"
    )


def watch(recorder: Recorder, phase: Phase, done: threading.Event, interactive: bool) -> None:
    if interactive:
        from rich.live import Live
        from rich.panel import Panel
        from rich.table import Table

        def render() -> Panel:
            grid = Table.grid(padding=(0, 2))
            s = recorder.samples[-1] if recorder.samples else None
            grid.add_row("phase", f"{phase.title}: {phase.expect}")
            if s is not None:
                for role, slo in (("prefill", "TTFT"), ("decode", "TPOT")):
                    value = s.ttft_p99 if role == "prefill" else s.tpot_p99
                    shown = (
                        "-"
                        if value is None
                        else (f"{value:.2f}s" if role == "prefill" else f"{value * 1000:.0f}ms")
                    )
                    grid.add_row(
                        role,
                        f"{s.ready[role]}/{s.replicas[role]} ready/desired   {slo} p99 {shown}",
                    )
                if "engine" in s.replicas:
                    grid.add_row(
                        "colocated model",
                        f"{s.ready.get('engine', 0)}/{s.replicas['engine']} engines   "
                        f"TTFT p99 {show_seconds(s.colocated_ttft_p99)}   "
                        f"TPOT p99 {show_millis(s.colocated_tpot_p99)}",
                    )
                grid.add_row("error budget", f"{s.budget or '-'} left (the lower SLO's)")
                grid.add_row("request rate", f"{phase.rate:g} req/s (to each model)")
                grid.add_row("last decision", s.reason)
            grid.add_row("kubectl get dm", recorder.status_line)
            return Panel(grid, title="disagg-operator demo")

        with Live(render(), refresh_per_second=2, transient=False) as live:
            while not done.wait(0.5):
                live.update(render())
        return
    while not done.wait(5.0):
        print(line(recorder, phase, phase.rate), flush=True)
