"""The engine launcher, run for real with a stand-in engine executable and a fake sysfs, and
with nothing but the standard library on its path (``python -S``: no site-packages), as the
engine images run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from disagg_engine.launcher import EX_CONFIG, plan_launch
from disagg_engine.preflight import Port, can_pin_memory, decide

ENGINE_SRC = ROOT / "engine" / "src"
STDLIB_ONLY = [sys.executable, "-S", "-m", "disagg_engine.cli"]

STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["STAND_IN_OUT"], "w") as out:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, out)
"""


def _hca(
    sysfs: Path,
    name: str,
    state: str = "4: ACTIVE",
    link: str = "InfiniBand",
    roce_gids: dict[int, tuple[str, str]] | None = None,
) -> None:
    port = sysfs / "class" / "infiniband" / name / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text(link + "\n")
    for index, (kind, gid) in (roce_gids or {}).items():
        (port / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
        (port / "gids").mkdir(exist_ok=True)
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
        (port / "gids" / str(index)).write_text(gid + "\n")


@pytest.fixture
def pod(tmp_path: Path) -> dict[str, Path]:
    engine = tmp_path / "fake-vllm"
    engine.write_text(STAND_IN.format(python=sys.executable))
    engine.chmod(0o755)
    (tmp_path / "dev" / "infiniband").mkdir(parents=True)
    return {
        "sysfs": tmp_path / "sys",
        "dev": tmp_path / "dev",
        "engine": engine,
        "out": tmp_path / "out.json",
    }


def _launch(
    pod: dict[str, Path], **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, object] | None]:
    full_env = {
        **os.environ,
        "DISAGG_SYSFS_ROOT": str(pod["sysfs"]),
        "DISAGG_DEV_ROOT": str(pod["dev"]),
        "STAND_IN_OUT": str(pod["out"]),
        "POD_IP": "10.1.2.3",
        "DISAGG_ROLE": "prefill",
        "PYTHONPATH": str(ENGINE_SRC),
        **env,
    }
    for key in ("UCX_NET_DEVICES", "UCX_IB_GID_INDEX", "VLLM_NIXL_SIDE_CHANNEL_HOST"):
        if key not in env:
            full_env.pop(key, None)
    result = subprocess.run(
        [
            *STDLIB_ONLY,
            "launch",
            "--",
            str(pod["engine"]),
            "serve",
            "m",
            "--port",
            "8000",
        ],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    seen = json.loads(pod["out"].read_text()) if pod["out"].exists() else None
    return result, seen


def test_rdma_autodetects_active_ports_and_roce_gid_then_execs(pod: dict[str, Path]) -> None:
    _hca(
        pod["sysfs"],
        "mlx5_0",
        link="Ethernet",
        roce_gids={
            0: ("IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0001"),
            1: ("RoCE v2", "fe80:0000:0000:0000:0000:0000:0000:0001"),
            3: ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a01:0203"),
        },
    )
    _hca(pod["sysfs"], "mlx5_1", state="1: DOWN")
    (pod["dev"] / "infiniband" / "uverbs0").touch()
    result, seen = _launch(pod, DISAGG_TRANSPORT="rdma", DISAGG_BACKEND="vllm")
    assert result.returncode == 0, result.stderr
    assert seen is not None
    assert seen["argv"][1:] == ["serve", "m", "--port", "8000"]  # type: ignore[index]
    env = seen["env"]
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"  # type: ignore[index]
    assert env["UCX_IB_GID_INDEX"] == "3"  # type: ignore[index]
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"  # type: ignore[index]
    assert "RDMA preflight: active ports mlx5_0:1" in result.stderr


def test_explicit_settings_win_over_detection(pod: dict[str, Path]) -> None:
    _hca(pod["sysfs"], "mlx5_0")
    _hca(pod["sysfs"], "mlx5_1")
    (pod["dev"] / "infiniband" / "uverbs0").touch()
    result, seen = _launch(
        pod,
        DISAGG_TRANSPORT="rdma",
        UCX_NET_DEVICES="mlx5_1:1",
        UCX_IB_GID_INDEX="0",
        VLLM_NIXL_SIDE_CHANNEL_HOST="10.9.9.9",
    )
    assert result.returncode == 0, result.stderr
    env = seen["env"]  # type: ignore[index]
    assert env["UCX_NET_DEVICES"] == "mlx5_1:1" and env["UCX_IB_GID_INDEX"] == "0"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.9.9.9"


def test_rdma_without_devices_fails_loudly(pod: dict[str, Path]) -> None:
    result, seen = _launch(pod, DISAGG_TRANSPORT="rdma")
    assert result.returncode == EX_CONFIG
    assert seen is None, "the engine must not start"
    assert "no RDMA device under /sys/class/infiniband" in result.stderr
    assert "allowTcpFallback" in result.stderr


def test_rdma_without_devices_continues_on_tcp_when_allowed(pod: dict[str, Path]) -> None:
    result, seen = _launch(
        pod, DISAGG_TRANSPORT="rdma", DISAGG_RDMA_TCP_FALLBACK="true", UCX_NET_DEVICES="mlx5_0:1"
    )
    assert result.returncode == 0
    assert "continuing with TCP" in result.stderr
    assert "UCX_NET_DEVICES" not in seen["env"]  # type: ignore[index,operator]


def test_named_device_that_is_missing_is_an_error(pod: dict[str, Path]) -> None:
    _hca(pod["sysfs"], "mlx5_0")
    (pod["dev"] / "infiniband" / "uverbs0").touch()
    result, _ = _launch(pod, DISAGG_TRANSPORT="rdma", UCX_NET_DEVICES="mlx5_7:1")
    assert result.returncode == EX_CONFIG
    assert (
        "UCX_NET_DEVICES names mlx5_7:1, which this pod does not have (present: mlx5_0:1)"
        in result.stderr
    )


def test_tcp_transport_skips_preflight_and_sets_sglang_host(pod: dict[str, Path]) -> None:
    result, seen = _launch(pod, DISAGG_TRANSPORT="tcp", DISAGG_BACKEND="sglang")
    assert result.returncode == 0
    assert "RDMA preflight" not in result.stderr
    assert seen["env"]["SGLANG_HOST_IP"] == "10.1.2.3"  # type: ignore[index]


def test_missing_engine_binary_is_explained(tmp_path: Path) -> None:
    result = subprocess.run(
        [*STDLIB_ONLY, "launch", "--", "no-such-engine"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "DISAGG_TRANSPORT": "tcp", "PYTHONPATH": str(ENGINE_SRC)},
    )
    assert result.returncode == 127 and "no-such-engine: command not found" in result.stderr


def test_decisions() -> None:
    active = Port("mlx5_0", 1, True, "InfiniBand", None)
    assert decide([active], ["uverbs0"], True, None, None).ucx_net_devices == "mlx5_0:1"
    no_pin = decide([active], ["uverbs0"], False, None, None)
    assert any("IPC_LOCK" in p for p in no_pin.problems)
    no_verbs = decide([active], [], True, None, None)
    assert any("uverbs" in p for p in no_verbs.problems)
    assert can_pin_memory("CapEff:\t0000000000004000\n", 64 * 1024)
    assert not can_pin_memory("CapEff:\t0000000000000000\n", 64 * 1024)
    plan = plan_launch({"DISAGG_TRANSPORT": "tcp"}, None)
    assert not plan.fatal and plan.notes == []
