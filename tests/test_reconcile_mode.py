"""The reconcile pass in colocated mode and across a mode switch, against the in-memory API
server: the old pools serve until the router has moved to ready new ones, and the colocated
engine pool scales on either SLO."""

from __future__ import annotations

from typing import Any

from conftest import load_example
from disagg.autoscale.policy import Signals
from disagg.naming import labels
from test_reconcile_pass import NAME, NS, World, autoscaled

Obj = dict[str, Any]


def _deployments(world: World) -> set[str]:
    return {o["metadata"]["name"] for o in world.kube.objects.values() if o["kind"] == "Deployment"}


def _router_args(world: World) -> list[str]:
    args: list[str] = world.deployment("router")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    return args


async def test_a_switch_to_colocated_keeps_prefill_and_decode_until_traffic_has_moved() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    world.pools_ready("prefill", "decode", "router")
    await world.reconcile()
    world.edit({"mode": "colocated"})

    await world.reconcile()
    pools = {f"{NAME}-prefill", f"{NAME}-decode", f"{NAME}-engine", f"{NAME}-router"}
    assert _deployments(world) == pools
    assert "--colocated" not in _router_args(world)  # still routing to prefill and decode
    progressing = world.condition("Progressing")
    assert progressing["reason"] == "SwitchingMode"
    assert "waiting for engine to be ready" in progressing["message"]
    ready = world.condition("Ready")
    assert ready["status"] == "True", ready  # the old pools serve meanwhile
    assert world.model()["status"]["engine"]["summary"] == "0/1"

    world.pools_ready("engine")
    await world.reconcile()
    assert "--colocated" in _router_args(world)  # the router rolls over to the engine pool
    assert _deployments(world) == pools
    assert "the router moves traffic to engine" in world.condition("Progressing")["message"]

    world.pools_ready("router")  # every router pod runs the new template
    await world.reconcile()
    assert _deployments(world) == {f"{NAME}-engine", f"{NAME}-router"}
    deleted = world.events("Deleted")
    assert len(deleted) == 1
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        assert f"{kind} {NAME}-prefill" in deleted[0]["message"]
    status = world.model()["status"]
    assert "prefill" not in status and status["engine"]["summary"] == "1/1"
    assert world.condition("Progressing")["reason"] == "RolloutComplete"
    writes = len(world.kube.writes)
    await world.reconcile()
    assert world.kube.writes[writes:] == []  # settled: a resync costs nothing


async def test_a_router_pod_still_draining_holds_the_old_pools() -> None:
    world = World(load_example("minimal"))
    await world.reconcile()
    world.pools_ready("prefill", "decode", "router")
    world.edit({"mode": "colocated"})
    await world.reconcile()
    world.pools_ready("engine")
    await world.reconcile()
    world.pools_ready("router")
    draining = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-router-old", "namespace": NS, "deletionTimestamp": "2027-01-01T00:00:00Z",
            "labels": labels(NAME, "router"),
        },
    }  # fmt: skip
    world.kube.put(draining)
    await world.reconcile()
    assert f"{NAME}-prefill" in _deployments(world)
    await world.kube.delete("Pod", NS, f"{NAME}-router-old")
    await world.reconcile()
    assert f"{NAME}-prefill" not in _deployments(world)


async def test_the_colocated_engine_pool_scales_up_on_its_ttft_alone() -> None:
    manifest = autoscaled()
    manifest["spec"]["mode"] = "colocated"
    world = World(manifest)
    await world.reconcile()
    world.pools_ready("engine", "router")
    # TPOT is fine; prompts wait: the prefill phase asks for more engines.
    world.prometheus.prefill = Signals(p99=6.0, request_rate=20.0, queue=40.0, running=8.0,
                                       pods_reporting=1)  # fmt: skip
    world.clock.now += 15
    await world.reconcile()
    assert world.prometheus.queries == 2  # both phases, from the engine pool's pods
    grown = world.deployment("engine")["spec"]["replicas"]
    assert grown > 1
    status = world.model()["status"]
    assert status["engine"]["desiredReplicas"] == grown
    assert status["engine"]["lastScaleReason"].startswith("TTFT: scale up")
    scaled = world.events("ScaledUp")
    assert len(scaled) == 1 and scaled[0]["message"].startswith(f"engine 1 -> {grown}")
    assert "prefill" not in status and "decode" not in status


async def test_an_autoscaled_switch_starts_the_new_pool_with_the_old_pools_gpus() -> None:
    manifest = autoscaled()
    manifest["spec"]["decode"] = {"autoscaling": {"minReplicas": 1, "maxReplicas": 8}}
    world = World(manifest)
    await world.reconcile()
    for role, size in (("prefill", 3), ("decode", 2)):
        await world.kube.patch("Deployment", NS, f"{NAME}-{role}", {"spec": {"replicas": size}})
    world.pools_ready("prefill", "decode", "router")
    await world.reconcile()
    world.edit({"mode": "colocated"})
    await world.reconcile()
    # Five one-GPU replicas serve now: the engine pool starts with five, not its minimum.
    assert world.deployment("engine")["spec"]["replicas"] == 5
    assert world.deployment("prefill")["spec"]["replicas"] == 3  # kept as it runs
    world.pools_ready("engine")
    await world.reconcile()
    world.pools_ready("router")
    await world.reconcile()
    world.edit({"mode": "disaggregated"})
    await world.reconcile()
    # Back: the engine pool's five GPUs, shared between the two new pools.
    assert world.deployment("prefill")["spec"]["replicas"] == 3
    assert world.deployment("decode")["spec"]["replicas"] == 3
    assert world.deployment("engine")["spec"]["replicas"] == 5
