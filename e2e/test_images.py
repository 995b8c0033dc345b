"""The operator and router images, built here with images/build.sh (mmdebstrap, podman; no
Docker) and started with Debian's podman as the cluster would run them: non-root, read-only
root filesystem, a writable /tmp only. The engine Dockerfile's two targets, built on a stand-in
for the upstream base images (which cannot be pulled here), start their engine through the
launcher and add nothing but it to the base's Python."""

from __future__ import annotations

import ast
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dataplane import LOG_DIR, engine
from disagg.demo.procs import wait_for
from disagg.devcluster.layout import cache_dir, free_port
from harness import ROOT, Kube

IMAGES = cache_dir() / "images"
UID = "65532"


ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "CONTAINERS_CONF": str(ROOT / "images" / "containers.conf"),
}
"""images/containers.conf: this VM forbids raising rlimits in a container's init."""


def podman_argv(*args: str) -> list[str]:
    # crun refuses hosts with hybrid cgroups; runc runs them.
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    return ["podman", *runtime, *args]


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        podman_argv(*args), capture_output=True, text=True, timeout=timeout, check=False, env=ENV
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed: {result.stderr}")
    return result


def background(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A container left running, its output in ``log`` (the caller removes it by name)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(podman_argv(*args), stdout=out, stderr=subprocess.STDOUT, env=ENV)


def await_ok(what: str, url: str, log: Path, timeout: float) -> None:
    """Wait until ``url`` answers 200; on timeout, fail with the container's last output."""

    def ok() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(f"{what} to answer {url}", ok, timeout=timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{log.read_text()[-2000:]}") from None


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """image -> tag, built (or found in the cache) by the same script as `make images`."""
    result = subprocess.run(
        ["bash", str(ROOT / "images" / "build.sh"), "operator", "router"],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return {name: (IMAGES / name / "tag").read_text().strip() for name in ("operator", "router")}


@pytest.fixture(scope="module")
def engine_images() -> dict[str, str]:
    """target (``vllm``, ``sglang``, ``base``) -> tag, from `images/build.sh engine-standin`."""
    result = subprocess.run(
        ["bash", str(ROOT / "images" / "build.sh"), "engine-standin"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    directory = IMAGES / "engine-standin"
    return {
        target: (directory / f"tag-{target}").read_text().strip()
        for target in ("vllm", "sglang", "base")
    }


def run(
    tag: str, *args: str, entrypoint: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    flags = ["--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none"]
    if entrypoint:
        flags += ["--entrypoint", entrypoint]
    for key, value in (env or {}).items():
        flags += ["--env", f"{key}={value}"]
    return podman("run", *flags, tag, *args, check=False)


@pytest.mark.parametrize("name", ["operator", "router"])
def test_each_image_runs_as_its_own_user_on_a_read_only_root(
    images: dict[str, str], name: str
) -> None:
    tag = images[name]
    assert run(tag, "-u", entrypoint="id").stdout.strip() == UID
    refused = run(tag, "-c", "touch /probe", entrypoint="sh")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    helped = run(tag, "--help")
    assert helped.returncode == 0, helped.stderr
    assert ("usage: disagg-router" if name == "router" else "usage: disagg") in helped.stdout


@pytest.mark.parametrize("name", ["operator", "router"])
def test_each_image_lists_its_packages_and_holds_exactly_the_locked_ones(name: str) -> None:
    directory = IMAGES / name
    debian = (directory / "packages-debian.txt").read_text().split("\n")
    assert any(line.startswith("python3.11 ") for line in debian), debian[:5]
    python = dict(
        line.split(" ")
        for line in (directory / "packages-python.txt").read_text().split("\n")
        if line
    )
    locked = dict(
        line.split("==")
        for line in (ROOT / "images" / f"{name}.lock").read_text().splitlines()
        if line and not line.startswith("#")
    )
    canonical = {key.lower().replace("_", "-"): value for key, value in python.items()}
    version = canonical.pop("disagg-operator")
    if name == "operator":
        assert canonical.pop("disagg-engine") == version
    assert canonical == locked
    if name == "router":  # the router extra's closure: no client for what it never calls
        assert not {"kubernetes", "kopf", "prometheus-api-client", "pydantic"} & set(canonical)
    assert "matplotlib" not in canonical and "numpy" not in canonical


def test_the_router_image_serves_health_and_proxies_to_an_engine(images: dict[str, str]) -> None:
    backend = engine("img-engine", "127.45.0.1", "both", time_scale=0.05)
    port = free_port()
    name = f"disagg-router-{uuid.uuid4().hex[:8]}"
    flags = ["--rm", "--read-only", "--tmpfs", "/tmp", "--network", "host", "--name", name]
    args = ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m"]
    log = LOG_DIR / "img-router.log"
    proc = background(log, "run", *flags, images["router"], *args, "--decode", backend.url)
    try:
        url = f"http://127.0.0.1:{port}"

        await_ok("the router container", url + "/health", log, timeout=60)
        answer = httpx.post(
            url + "/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 4},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
    finally:
        podman("rm", "--force", name, check=False)
        proc.wait(timeout=60)
        backend.stop()


@pytest.fixture
def empty_namespace(kube: Kube) -> Iterator[str]:
    name = f"img-{uuid.uuid4().hex[:8]}"
    kube.run("create", "namespace", name)
    yield name
    kube.run("delete", "namespace", name, "--wait=false", check=False)


def test_the_operator_image_watches_a_real_api_server(
    images: dict[str, str], kube: Kube, empty_namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    name = f"disagg-operator-{uuid.uuid4().hex[:8]}"
    # The operator runs as its own user, as from a mounted Secret readable to it.
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(kube.layout.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)
    tmp_path.chmod(0o755)
    flags = [
        "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "host", "--name", name,
        "-v", f"{kubeconfig}:/etc/disagg/kubeconfig:ro",
    ]  # fmt: skip
    args = [
        "run", "--kubeconfig", "/etc/disagg/kubeconfig", "--namespace", empty_namespace,
        "--metrics-address", f"127.0.0.1:{port}", "--no-leader-election",
    ]  # fmt: skip
    log = LOG_DIR / "img-operator.log"
    proc = background(log, "run", *flags, images["operator"], *args)
    try:
        # /readyz answers 200 only once the operator watches and reaches the API server.
        await_ok("the operator container", f"http://127.0.0.1:{port}/readyz", log, timeout=90)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    finally:
        podman("rm", "--force", name, check=False)
        proc.wait(timeout=60)


PYTHON_DISTRIBUTIONS = (
    "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))"
)


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_each_engine_target_adds_only_the_dependency_free_launcher_to_its_base(
    engine_images: dict[str, str], target: str
) -> None:
    def distributions(tag: str) -> list[str]:
        listed = run(tag, "-c", PYTHON_DISTRIBUTIONS, entrypoint="python3")
        assert listed.returncode == 0, listed.stderr
        return list(ast.literal_eval(listed.stdout.strip()))

    base = distributions(engine_images["base"])
    assert sorted([*base, "disagg-engine"]) == distributions(engine_images[target])
    requires = run(
        engine_images[target],
        "-c", "import importlib.metadata as m; print(m.requires('disagg-engine'))",
        entrypoint="python3",
    )  # fmt: skip
    assert requires.stdout.strip() == "None", requires.stdout + requires.stderr


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_each_engine_target_execs_the_engine_through_the_launcher(
    engine_images: dict[str, str], target: str
) -> None:
    side_channel = "VLLM_NIXL_SIDE_CHANNEL_HOST" if target == "vllm" else "SGLANG_HOST_IP"
    # The image's own entrypoint, as the pod runs it: the launcher fills in the pod IP, then
    # the engine (a stand-in: python3) replaces it and prints what it was given.
    started = run(
        engine_images[target],
        "python3", "-c", f"import os; print(os.getpid(), os.environ['{side_channel}'])",
        env={"POD_IP": "10.1.2.3", "DISAGG_BACKEND": target},
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == ["1", "10.1.2.3"], started.stdout
    assert f"{side_channel}=10.1.2.3 (pod IP)" in started.stderr
    assert "starting python3" in started.stderr


def test_the_engine_image_refuses_rdma_it_cannot_use(engine_images: dict[str, str]) -> None:
    rdma = {"DISAGG_TRANSPORT": "rdma"}
    refused = run(engine_images["vllm"], "python3", "-c", "print('served')", env=rdma)
    assert refused.returncode == 78, refused.stdout + refused.stderr
    assert "served" not in refused.stdout
    assert "network.transport is rdma and RDMA is not usable" in refused.stderr
    fallback = run(
        engine_images["vllm"], "python3", "-c", "print('served')",
        env={**rdma, "DISAGG_RDMA_TCP_FALLBACK": "true"},
    )  # fmt: skip
    assert fallback.returncode == 0 and fallback.stdout.strip() == "served", fallback.stderr
    assert "continuing with TCP" in fallback.stderr
