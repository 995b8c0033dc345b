"""Colocated mode: one engine pool that prefills and decodes, from the spec to the router."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from conftest import load_example
from disagg.api import parse_model
from disagg.api.resource import ManifestError
from disagg.render import RenderContext, render_all
from disagg.router.app import build_app
from disagg.router.endpoints import Endpoint, Picker, Pool
from disagg.router.metrics import RouterMetrics
from disagg.router.state import Router, RouterConfig
from disagg.status import Observed, compute_status
from disagg.transition import Switch, plan_switch

T0 = "2026-01-01T00:00:00Z"


def _colocated(**spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(load_example("colocated"))
    manifest["metadata"]["uid"] = "uid-1"
    manifest["spec"].update(spec)
    return manifest


def _children(manifest: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    objects = render_all(RenderContext(parse_model(manifest)))
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _container(children: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    container: dict[str, Any] = children[("Deployment", name)]["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def test_a_colocated_model_renders_one_engine_pool_without_kv_transfer() -> None:
    network = {"transport": "rdma", "rdma": {"resourceName": "rdma/hca", "networks": ["ib0"]}}
    children = _children(_colocated(network=network))
    pools = sorted(name for kind, name in children if kind == "Deployment")
    assert pools == ["chat-engine", "chat-router"]
    assert ("Service", "chat-engine") in children and ("Service", "chat-prefill") not in children
    engine = _container(children, "chat-engine")
    argv = engine["args"]
    assert "--kv-transfer-config" not in argv and "--enable-chunked-prefill" in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "2048"  # spec.decode's
    env = {e["name"] for e in engine["env"]}
    assert env.isdisjoint({"VLLM_NIXL_SIDE_CHANNEL_HOST", "DISAGG_KV_CONNECTOR", "UCX_NET_DEVICES"})
    assert [p["name"] for p in engine["ports"]] == ["http"]
    # No KV moves between pods, so the RDMA network and devices are not asked for.
    assert "rdma/hca" not in engine["resources"]["requests"]
    assert "securityContext" not in engine
    template = children[("Deployment", "chat-engine")]["spec"]["template"]
    assert "k8s.v1.cni.cncf.io/networks" not in template["metadata"].get("annotations", {})
    router = _container(children, "chat-router")["args"]
    assert "--colocated" in router and "--prefill-selector" not in router
    assert router[router.index("--decode-selector") + 1].endswith("disagg.dev/role=engine")


def test_sglang_colocated_mixes_prompt_chunks_into_running_batches() -> None:
    children = _children(_colocated(runtime={"backend": "sglang"}))
    argv = _container(children, "chat-engine")["args"]
    assert "--enable-mixed-chunk" in argv and "--disaggregation-mode" not in argv
    assert argv[argv.index("--chunked-prefill-size") + 1] == "2048"
    assert "bootstrap" not in json.dumps(_container(children, "chat-engine")["ports"])


def test_rules_of_the_split_do_not_bind_a_colocated_model() -> None:
    # Prefill TP 3 against decode TP 2 fails NIXL's handshake, but colocated moves no KV.
    uneven = {"prefill": {"tensorParallelSize": 3}, "decode": {"tensorParallelSize": 2}}
    parse_model(_colocated(**uneven))
    with pytest.raises(ManifestError, match="multiple of the smaller"):
        parse_model(_colocated(mode="disaggregated", **uneven))
    # The GPU budget counts the pools the mode runs: the engine pool alone here.
    budget = {"enabled": True, "maxTotalGPUs": 1}
    parse_model(_colocated(autoscaling=budget))
    with pytest.raises(ManifestError, match="maxTotalGPUs is smaller"):
        parse_model(_colocated(mode="disaggregated", autoscaling=budget))


def test_external_scalers_are_refused_for_a_colocated_model() -> None:
    external = {"enabled": True, "mode": "external"}
    with pytest.raises(ManifestError) as refused:
        parse_model(_colocated(autoscaling=external))
    assert "spec.autoscaling.mode" in str(refused.value)
    assert "not available with mode colocated" in str(refused.value)


def _deployment(ready: int, desired: int) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": 1, "replicas": desired, "readyReplicas": ready,
            "updatedReplicas": desired, "availableReplicas": ready,
        },
    }  # fmt: skip


def test_a_colocated_model_is_ready_when_its_engine_and_router_are() -> None:
    starting = Observed(
        generation=1,
        deployments={"engine": _deployment(0, 2), "router": _deployment(2, 2)},
        roles=("engine",),
    )
    status = compute_status(starting, None, T0)
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert ready.status == "False" and ready.message == "no ready replica yet in: engine"
    assert status.engine is not None and status.engine.summary == "0/2"
    assert status.prefill is None and status.decode is None
    serving = Observed(
        generation=1,
        deployments={"engine": _deployment(2, 2), "router": _deployment(2, 2)},
        roles=("engine",),
    )
    ready = next(c for c in compute_status(serving, status, T0).conditions if c.type == "Ready")
    assert ready.status == "True" and ready.message == "engine and router have ready replicas"


async def test_the_colocated_router_sends_each_request_as_sent_to_one_engine() -> None:
    received: list[dict[str, Any]] = []

    async def engine(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"choices": [{"text": "ok"}], "usage": {"completion_tokens": 1}})

    app = web.Application()
    app.router.add_post("/v1/completions", engine)
    server = TestServer(app)
    await server.start_server()
    decode = Pool("decode")
    decode.replace([Endpoint(str(server.make_url("")).rstrip("/"))])
    router = Router(
        RouterConfig(served_model_name="m", colocated=True, pd_threshold=0),
        Pool("prefill"), decode, Picker("least-outstanding"), RouterMetrics(),
    )  # fmt: skip
    client = TestClient(TestServer(build_app(router)))
    await client.start_server()
    try:
        body = {"model": "m", "prompt": "x" * 8000, "max_tokens": 1}
        answer = await client.post("/v1/completions", json=body)
        assert answer.status == 200, await answer.text()
        assert answer.headers["X-Disagg-Path"] == "colocated"
        assert received == [body]  # no kv_transfer_params, no max_tokens rewrite
        metrics = await (await client.get("/metrics")).text()
        assert 'disagg_router_requests_total{code="200",path="colocated"} 1.0' in metrics
    finally:
        await client.close()
        await server.close()


def _router(mode: str, settled: bool = True) -> dict[str, Any]:
    args = ["--colocated"] if mode == "colocated" else ["--prefill-selector", "x"]
    router = _deployment(2, 2)
    router["spec"]["template"] = {"spec": {"containers": [{"args": args}]}}
    if not settled:
        router["metadata"]["generation"] = 2  # the new template is not rolled out yet
    return router


def test_a_switch_keeps_the_old_pools_until_the_router_has_moved_to_ready_new_ones() -> None:
    old = {"prefill": _deployment(1, 1), "decode": _deployment(2, 2)}
    # The engine pool is starting: the router stays on prefill/decode, which are kept.
    live = {**old, "engine": _deployment(1, 2), "router": _router("disaggregated")}
    starting = plan_switch("colocated", live, router_enabled=True)
    assert starting.router_mode == "disaggregated"
    assert starting.retiring == ("prefill", "decode")
    assert starting.message and "waiting for engine to be ready" in starting.message
    # Ready: the router is rendered for the new mode; the old pools stay while it rolls out,
    # and while an old router pod still drains.
    ready = {**old, "engine": _deployment(2, 2)}
    unfinished = [(_router("disaggregated"), 0), (_router("colocated", False), 0)]
    for router, draining in [*unfinished, (_router("colocated"), 1)]:
        moving = plan_switch("colocated", {**ready, "router": router}, True, draining)
        assert (moving.router_mode, moving.retiring) == ("colocated", ("prefill", "decode"))
    done = plan_switch("colocated", {**ready, "router": _router("colocated")}, True, 0)
    assert done == Switch("colocated")
    # Without a router nothing moves traffic: the old pools go once the new ones are ready.
    assert plan_switch("colocated", ready, router_enabled=False).retiring == ()
    # And back: the engine pool serves until prefill and decode both are ready.
    live = {
        "engine": _deployment(2, 2), "prefill": _deployment(1, 1),
        "decode": _deployment(0, 2), "router": _router("colocated"),
    }  # fmt: skip
    back = plan_switch("disaggregated", live, router_enabled=True)
    assert (back.router_mode, back.retiring) == ("colocated", ("engine",))
