"""Colocated mode end to end, and one field edit that switches a serving model between modes.

Real pieces: the API server and controllers, the operator, the pod emulator playing every
pod the operator creates (an engine simulator per engine pod, and ``disagg router`` with the
rendered arguments per router pod, each on the pod's IP, with readiness and the preStop hooks
played as the kubelet would), and a client that, like a Service, sends each request to a
ready router pod that is not terminating. Nothing is faked but the GPUs.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import yaml

from disagg.demo.procs import long_prompt
from harness import Kube, condition, emulated_pods, example, scoped_operator, wait_for

MODEL = "chat"


def _manifest() -> dict[str, Any]:
    manifest = example("colocated")
    spec = manifest["spec"]
    spec["model"] = {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedName": MODEL}
    spec["autoscaling"] = {"enabled": False}
    for pool in ("prefill", "decode"):
        spec[pool] = {"replicas": 1, "maxNumBatchedTokens": 2048}
    spec["network"] = {"transport": "tcp", "shmSize": "1Gi"}
    spec["router"] = {"replicas": 2, "prefillThresholdTokens": 256}
    return manifest


@dataclass
class Traffic:
    """Open-loop streaming requests to ready router pods, from a thread of its own."""

    kube: Kube
    namespace: str
    rate: float = 4.0
    paths: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    routers: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Traffic:
        self._refresh()
        self._threads = [
            threading.Thread(target=self._watch_routers, daemon=True),
            threading.Thread(target=lambda: asyncio.run(self._send()), daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _refresh(self) -> None:
        """Like kube-proxy: the ready router pods that are not terminating, or if there are
        none, the terminating ones still serving (ready)."""
        selector = f"disagg.dev/role=router,disagg.dev/model={MODEL}"
        serving = [
            pod
            for pod in self.kube.items("pods", self.namespace, selector)
            if (condition(pod, "Ready") or {}).get("status") == "True"
        ]
        ready = [p for p in serving if not p["metadata"].get("deletionTimestamp")]
        self.routers = [f"http://{p['status']['podIP']}:8000" for p in ready or serving]

    def _watch_routers(self) -> None:
        while not self._stop.wait(0.5):
            self._refresh()

    async def _send(self) -> None:
        rng = random.Random(7)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            tasks = []
            while not self._stop.is_set():
                tokens = rng.choice([64, 1500, 3000])
                tasks.append(asyncio.create_task(self._one(session, tokens)))
                await asyncio.sleep(rng.expovariate(self.rate))
            await asyncio.gather(*tasks)

    async def _one(self, session: aiohttp.ClientSession, tokens: int) -> None:
        if not self.routers:
            self.failures.append("no ready router pod")
            return
        url = random.choice(self.routers)
        body = {"model": MODEL, "prompt": long_prompt(tokens), "max_tokens": 16, "stream": True}
        try:
            async with session.post(url + "/v1/completions", json=body) as response:
                text = await response.text()
                if response.status != 200 or '"error"' in text or "[DONE]" not in text:
                    self.failures.append(f"{url}: HTTP {response.status}: {text[:300]}")
                    return
                self.paths[response.headers.get("X-Disagg-Path", "?")] += 1
        except (aiohttp.ClientError, TimeoutError) as error:
            self.failures.append(f"{url}: {error!r}")


@pytest.fixture
def emulated(namespace: str) -> Iterator[None]:
    with emulated_pods(namespace, "switch", 1):
        yield


def _deployments(kube: Kube, namespace: str) -> set[str]:
    return {d["metadata"]["name"] for d in kube.items("deployments", namespace)}


def _settled(kube: Kube, namespace: str, pools: set[str]) -> bool:
    model = kube.get("dm", MODEL, namespace)
    progressing = condition(model, "Progressing") or {}
    ready = condition(model, "Ready") or {}
    return (
        _deployments(kube, namespace) == {*pools, f"{MODEL}-router"}
        and progressing.get("status") == "False"
        and ready.get("status") == "True"
        and (model or {}).get("status", {}).get("observedGeneration")
        == (model or {}).get("metadata", {}).get("generation")
    )


def _switch(kube: Kube, namespace: str, mode: str) -> None:
    patch = json.dumps({"spec": {"mode": mode}})
    kube.run("patch", "dm", MODEL, "-n", namespace, "--type", "merge", "-p", patch)


def test_a_colocated_model_serves_and_switches_mode_under_load_without_a_failed_request(
    kube: Kube, namespace: str, emulated: None
) -> None:
    operator = scoped_operator(kube, namespace, "operator-mode-switch")
    try:
        kube.apply(yaml.safe_dump(_manifest()), namespace)
        wait_for(
            "the colocated model to be Ready",
            lambda: _settled(kube, namespace, {f"{MODEL}-engine"}),
            timeout=120,
        )
        model = kube.get("dm", MODEL, namespace) or {}
        assert model["status"]["engine"]["summary"] == "1/1"
        assert "prefill" not in model["status"]

        with Traffic(kube, namespace) as traffic:
            wait_for(
                "traffic through the engine pool",
                lambda: traffic.paths["colocated"] >= 10,
                timeout=60,
            )
            _switch(kube, namespace, "disaggregated")
            seen: set[str] = set()

            def split_done() -> bool:
                seen.update(_deployments(kube, namespace))
                return _settled(kube, namespace, {f"{MODEL}-prefill", f"{MODEL}-decode"})

            wait_for("the switch to disaggregated", split_done, timeout=240)
            # The engine pool was kept beside the new pools until the router had moved.
            assert {f"{MODEL}-engine", f"{MODEL}-prefill"} <= seen
            before = traffic.paths["disaggregated"]
            wait_for(
                "long prompts through prefill then decode",
                lambda: traffic.paths["disaggregated"] >= before + 10,
                timeout=60,
            )
            _switch(kube, namespace, "colocated")
            wait_for(
                "the switch back to colocated",
                lambda: _settled(kube, namespace, {f"{MODEL}-engine"}),
                timeout=240,
            )
            after = traffic.paths["colocated"]
            wait_for(
                "traffic through the engine pool again",
                lambda: traffic.paths["colocated"] >= after + 10,
                timeout=60,
            )
        assert traffic.failures == [], traffic.failures[:5]
        assert traffic.paths["fallback"] == 0, traffic.paths
        events = kube.json("get", "events", "-n", namespace)["items"]
        assert any("deleted Deployment chat-engine" in e.get("message", "") for e in events)
    finally:
        operator.stop()
