"""Traffic stories against real engine simulators scraped by a real Prometheus, for
`disagg diagnose`: a long-prompt wave over steady chat, and uniform overload."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx

from dataplane import LOG_DIR, Proc, long_prompt, stream_completion
from disagg.demo.procs import wait_for
from disagg.devcluster.layout import free_port
from disagg.yamlio import dump

SCRAPE_SECONDS = 1
NAMESPACE = "diagnose"


@dataclass(frozen=True)
class Target:
    """One engine Prometheus scrapes, with the pool labels the operator's relabeling gives."""

    proc: Proc
    model: str
    role: str


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def prometheus(name: str, targets: list[Target], root: Path) -> Prometheus:
    """Debian's Prometheus scraping ``targets`` every second, labelled like engine pods."""
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed: run `make system-packages`"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    static = [
        {
            "targets": [t.proc.url.removeprefix("http://")],
            "labels": {
                "namespace": NAMESPACE,
                "disagg_model": t.model,
                "disagg_role": t.role,
                "pod": t.proc.name,
            },
        }
        for t in targets
    ]
    interval = f"{SCRAPE_SECONDS}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": "engines", "static_configs": static}],
    }
    (root / "prometheus.yml").write_text(dump(config))
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process)

    def scraped() -> bool:
        try:
            answer = httpx.get(f"{server.url}/api/v1/targets", timeout=2)
        except httpx.HTTPError:
            return False
        if answer.status_code != 200:  # 503 while it starts
            return False
        active = answer.json()["data"]["activeTargets"]
        return len(active) == len(targets) and all(t["health"] == "up" for t in active)

    try:
        wait_for("Prometheus to scrape every engine", scraped, timeout=30)
    except BaseException:
        server.stop()
        raise
    return server


@dataclass(frozen=True)
class Stream:
    """Poisson arrivals of one request shape between two offsets of the story (seconds)."""

    start: float
    end: float
    rate: float
    prompt_tokens: int
    max_tokens: int


async def drive(url: str, streams: list[Stream], seed: int, grace: float = 30.0) -> list[int]:
    """Send every stream's requests on time, without waiting for earlier ones; the statuses,
    0 for a request still unanswered ``grace`` seconds after the story ends (then abandoned,
    as clients of an overloaded service give up)."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    begin = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(at: float, stream: Stream) -> int:
            await asyncio.sleep(max(0.0, begin + at - time.monotonic()))
            prompt = long_prompt(stream.prompt_tokens)
            result = await stream_completion(session, url, prompt, stream.max_tokens)
            return result.status

        tasks = []
        for stream in streams:
            at = stream.start
            while True:
                at += rng.expovariate(stream.rate)
                if at >= stream.end:
                    break
                tasks.append(asyncio.create_task(one(at, stream)))
        story = max(stream.end for stream in streams)
        done, pending = await asyncio.wait(tasks, timeout=story + grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return [task.result() if task in done else 0 for task in tasks]
