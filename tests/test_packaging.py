"""Install artefacts: images, chart pins, generated files and the Argo CD health check."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import lupa
import pytest
import yaml

from conftest import ROOT
from disagg import dashboards, versions

CHART = ROOT / "charts" / "disagg-operator"
HEALTH_LUA = (ROOT / "manifests" / "argocd" / "health.lua").read_text()


def _dockerfile(name: str) -> str:
    return (ROOT / "images" / name / "Dockerfile").read_text()


@pytest.mark.parametrize("image", ["operator", "engine", "router"])
def test_dockerfiles_pass_hadolint(image: str) -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run(
        [str(hadolint), str(ROOT / "images" / image / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pinned_versions_agree_everywhere() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert project["version"] == versions.VERSION == chart["appVersion"]
    # The chart has its own version (a template-only fix needs no new image), SemVer 2.
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", chart["version"]), chart["version"]
    assert (
        f"{values['image']['repository']}:{chart['appVersion']}" == versions.DEFAULT_OPERATOR_IMAGE
    )
    engine = _dockerfile("engine")
    assert f"vllm/vllm-openai:v{versions.VLLM_VERSION}" in engine
    assert f"lmsysorg/sglang:v{versions.SGLANG_VERSION}" in engine
    assert f'"${{VERSION}}-vllm{versions.VLLM_VERSION}"' in engine
    assert f'"${{VERSION}}-sglang{versions.SGLANG_VERSION}"' in engine
    assert versions.DEFAULT_IMAGES.vllm.endswith(f":{versions.VERSION}-vllm{versions.VLLM_VERSION}")
    for image in ("operator", "engine", "router"):
        assert f"ARG VERSION={versions.VERSION}" in _dockerfile(image)
    for image in ("operator", "router"):
        assert re.search(r"FROM \$\{PYTHON_IMAGE\}", _dockerfile(image))
        assert "python:3.11.11-slim-bookworm" in _dockerfile(image), "base images are pinned"
        assert "USER 65532:65532" in _dockerfile(image)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--help"],
        ["router", "--help"],
        ["engine", "launch", "--help"],
        ["sim", "engine", "--help"],
    ],
    ids=lambda a: " ".join(a[:-1]),
)
def test_image_entrypoints_exist_and_run(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "disagg.cli", *argv], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "usage: disagg" in result.stdout


@functools.cache
def _third_party_imports(start: str) -> frozenset[str]:
    """Top-level names of the non-stdlib packages that ``start`` (a package or module of
    disagg) imports, directly or through other disagg modules, anywhere in their code."""
    graph = _import_graph()
    pending = [m for m in graph.modules if m == start or m.startswith(start + ".")]
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        if module not in seen:
            seen.add(module)
            pending.extend(graph.find_modules_directly_imported_by(module))
    roots = {m.split(".")[0] for m in seen}
    return frozenset(r for r in roots if r != "disagg" and r not in sys.stdlib_module_names)


@functools.cache
def _import_graph() -> Any:
    """disagg's import graph, external packages included (built once: it takes seconds)."""
    import grimp

    return grimp.build_graph("disagg", include_external_packages=True)


def _owners(imports: frozenset[str]) -> dict[str, set[str]]:
    """Each imported name's installed distributions (several for a namespace package such
    as ``opentelemetry``)."""
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    owners = packages_distributions()
    missing = sorted(name for name in imports if name not in owners)
    assert not missing, f"imported but installed by no distribution: {missing}"
    return {name: {canonicalize_name(d) for d in owners[name]} for name in imports}


def _declared(*texts: str) -> set[str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return {canonicalize_name(Requirement(text).name) for text in texts}


OPTIONAL_IMPORTS = {"kubernetes"}
"""Imported only to read a kubeconfig (disagg.kube.credentials, guarded): a router in a pod
reads its service account instead, so its image has no Kubernetes client."""


def test_the_router_extras_are_exactly_what_the_router_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = _declared(*extras["router"], *extras["tracing"])
    owners = _owners(_third_party_imports("disagg.router") - OPTIONAL_IMPORTS)
    undeclared = {name for name, dists in owners.items() if not dists & declared}
    assert undeclared == set(), "the router imports what its extras do not declare"
    unused = {d for d in declared if not any(d in dists for dists in owners.values())}
    assert unused == set(), "the router's extras declare what it never imports"
    assert "disagg_engine" not in _third_party_imports("disagg.router")


def test_every_third_party_import_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    runtime = _declared(
        *project["dependencies"], *extras["tokenizer"], *extras["tools"], *extras["tracing"]
    )
    owners = _owners(_third_party_imports("disagg"))
    assert {name for name, dists in owners.items() if not dists & runtime} == set()


def test_the_router_runs_without_the_operators_dependencies(tmp_path: Path) -> None:
    # What its image lacks is made unimportable; it still parses its flags and, as in a pod,
    # finds the API server from its service account.
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    script = f"""
import sys
for name in ("kubernetes", "kopf", "prometheus_api_client", "pydantic", "httpx", "disagg_engine"):
    sys.modules[name] = None
from pathlib import Path
from disagg.kube.credentials import load_credentials
from disagg.router.cli import main
creds = load_credentials(None, {{"KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "KUBERNETES_SERVICE_PORT": "443"}}, Path({str(tmp_path)!r}))
print(creds.host)
main(["--help"])
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "https://10.0.0.1:443" in result.stdout
    assert "usage: disagg-router" in result.stdout


def test_the_engine_distribution_is_versioned_with_the_project() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    engine = tomllib.loads((ROOT / "engine" / "pyproject.toml").read_text())["project"]
    assert engine["version"] == project["version"]
    assert f"disagg-engine=={engine['version']}" in project["dependencies"]
    assert engine["dependencies"] == [], "the engine images get nothing but the launcher"


def test_the_engine_launcher_installs_alone_and_runs_the_engine(tmp_path: Path) -> None:
    # Built (offline, with the dev environment's setuptools) and installed as the engine
    # images do, into a venv that has nothing else.
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    wheels = tmp_path / "wheels"
    subprocess.run([*pip, "wheel", "--no-index", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(ROOT / "engine")], check=True, timeout=300)  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheel = next(wheels.glob("disagg_engine-*.whl"))
    subprocess.run([*pip, "--python", str(python), "install", "--no-index", "--no-deps",
                    str(wheel)], check=True, timeout=120)  # fmt: skip
    installed = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         "print(sorted(d.metadata['Name'] for d in m.distributions()))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert installed == "['disagg-engine']"
    launched = subprocess.run(
        [str(venv / "bin" / "disagg-engine"), "launch", "--", "/bin/echo", "engine", "started"],
        capture_output=True, text=True, timeout=30, check=False,
        env={"PATH": "/usr/bin:/bin", "DISAGG_TRANSPORT": "tcp", "DISAGG_ROLE": "decode"},
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    assert launched.stdout == "engine started\n"
    assert "starting /bin/echo as decode" in launched.stderr


def test_chart_crd_is_the_generated_one() -> None:
    committed = (ROOT / "crds" / "disaggregatedmodels.disagg.dev.yaml").read_bytes()
    assert (CHART / "files" / "disaggregatedmodels.disagg.dev.yaml").read_bytes() == committed, (
        "run `make crds`"
    )


def _leaves(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def test_the_chart_readme_documents_every_value() -> None:
    sys.path.insert(0, str(ROOT / "manifests"))
    import generate

    assert (CHART / "README.md").read_text() == generate.chart_readme(), "run `make manifests`"
    values_text = (CHART / "values.yaml").read_text()
    described = {key: text for key, _, text in generate.values_table(values_text)}
    for leaf in _leaves(yaml.safe_load(values_text)):
        parts = leaf.split(".")
        owners = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        assert leaf in described, f"values.yaml key {leaf} was not read"
        assert any(described.get(o) for o in owners), f"values.yaml: say what {leaf} is"


def test_the_values_schema_is_generated_from_values_yaml() -> None:
    sys.path.insert(0, str(ROOT / "manifests"))
    import generate

    committed = (CHART / "values.schema.json").read_text()
    assert committed == generate.chart_values_schema(), "run `make manifests`"


def test_a_values_annotation_constrains_the_key_below_it_and_stays_out_of_its_description() -> None:
    sys.path.insert(0, str(ROOT / "manifests"))
    from values_doc import values_schema, values_table

    values = (
        "image:\n"
        "  # The image.\n"
        '  # @schema {"required": true, "minLength": 1}\n'
        "  repository: r\n"
        "  tag: ''\n"
        "# Free-form.\n"
        '# @schema {"additionalProperties": true}\n'
        "securityContext:\n"
        "  runAsUser: 1\n"
        '# @schema {"oneOf": [{"type": "boolean"}, {"type": "string", "enum": ["auto"]}]}\n'
        "enabled: auto\n"
    )
    schema = values_schema(values, title="t")
    image = schema["properties"]["image"]
    assert image["additionalProperties"] is False and image["required"] == ["repository"]
    assert image["properties"]["repository"] == {
        "type": "string",
        "minLength": 1,
        "description": "The image.",
    }
    assert image["properties"]["tag"] == {"type": "string", "description": "The image."}
    assert schema["properties"]["securityContext"] == {
        "type": "object",
        "additionalProperties": True,
        "description": "Free-form.",
    }
    assert "type" not in schema["properties"]["enabled"]
    assert ("image.repository", "r", "The image.") in values_table(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("# @schema {minimum: 1}\nreplicas: 2\n", "line 1: @schema is not JSON"),
        ('# @schema ["x"]\nreplicas: 2\n', "line 1: @schema must be a JSON object"),
        ("tag: null\n", "tag: a null default has no type"),
        ("a:\n  - b: 1\nc: {d: 1}\n", "missed: c.d"),
    ],
)
def test_a_values_file_the_generator_cannot_read_is_named_with_its_line(
    values: str, message: str
) -> None:
    sys.path.insert(0, str(ROOT / "manifests"))
    from values_doc import ValuesDocError, values_schema

    with pytest.raises(ValuesDocError, match=re.escape(message)):
        values_schema(values, title="t")


def test_argocd_patch_is_generated_from_health_lua() -> None:
    sys.path.insert(0, str(ROOT / "manifests"))
    import generate

    committed = (ROOT / "manifests" / "argocd" / "argocd-cm-patch.yaml").read_text()
    assert committed == generate.argocd_patch(), "run `make manifests`"
    data = yaml.safe_load(committed)["data"][
        "resource.customizations.health.disagg.dev_DisaggregatedModel"
    ]
    assert data.strip() == HEALTH_LUA.strip()


def _health(obj: dict[str, Any]) -> tuple[str, str]:
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)

    def to_lua(value: Any) -> Any:
        if isinstance(value, dict):
            return runtime.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([to_lua(v) for v in value])
        return value

    runtime.globals().obj = to_lua(obj)
    result = runtime.execute(HEALTH_LUA)
    return str(result["status"]), str(result["message"])


def _model(
    generation: int, observed: int | None, **conditions: tuple[str, str, str]
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m}
            for t, (s, r, m) in conditions.items()
        ]
    }
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"generation": generation}, "status": status}


@pytest.mark.parametrize(
    ("obj", "status", "message"),
    [
        ({"metadata": {"generation": 1}}, "Progressing", "Waiting for the disagg operator"),
        (
            _model(
                1,
                1,
                Ready=("True", "AllComponentsReady", "all good"),
                Progressing=("False", "RolloutComplete", ""),
            ),
            "Healthy",
            "all good",
        ),
        (_model(2, 1, Ready=("True", "AllComponentsReady", "ok")), "Progressing", "generation 2"),
        (
            _model(
                1,
                1,
                Ready=("True", "AllComponentsReady", "ok"),
                Progressing=("True", "RollingOut", "prefill: 1/2 updated"),
            ),
            "Progressing",
            "Rolling out: prefill: 1/2 updated",
        ),
        (
            _model(1, 1, Ready=("False", "ComponentsNotReady", "no ready replica yet in: decode")),
            "Progressing",
            "no ready replica yet in: decode",
        ),
        (
            _model(
                1,
                1,
                Ready=("False", "ComponentsNotReady", ""),
                Degraded=("True", "Unschedulable", "prefill pod p: Insufficient nvidia.com/gpu"),
            ),
            "Degraded",
            "Unschedulable: prefill pod p: Insufficient nvidia.com/gpu",
        ),
        (
            _model(3, 2, Degraded=("True", "InvalidSpec", "spec.x: unknown field")),
            "Degraded",
            "InvalidSpec: spec.x",
        ),
    ],
    ids=[
        "no-status",
        "healthy",
        "stale-generation",
        "rolling",
        "not-ready",
        "unschedulable",
        "invalid-spec",
    ],
)
def test_argocd_health_maps_conditions(obj: dict[str, Any], status: str, message: str) -> None:
    got_status, got_message = _health(obj)
    assert got_status == status and message in got_message


def _lock_module() -> Any:
    sys.path.insert(0, str(ROOT / "images"))
    try:
        import lock
    finally:
        sys.path.remove(str(ROOT / "images"))
    return lock


@pytest.mark.parametrize("image", ["operator", "router"])
def test_the_image_locks_are_what_the_tests_ran_with(image: str) -> None:
    lock = _lock_module()
    assert (ROOT / "images" / f"{image}.lock").read_text() == lock.lock_text(image), (
        "run `make lock`"
    )


@pytest.mark.parametrize("image", ["operator", "router"])
def test_every_locked_version_is_inside_the_declared_ranges(image: str) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = (ROOT / "images" / f"{image}.lock").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = (
        [*extras["router"], *extras["tracing"]]
        if image == "router"
        else list(project["dependencies"])
    )
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name == "disagg-engine":
            continue  # installed from ./engine beside the project
        assert name in pins, f"{image}.lock misses {name}"
        assert requirement.specifier.contains(pins[name]), (text, pins[name])


def test_installing_the_operator_pulls_no_plotting_simulator_or_dev_package() -> None:
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {Requirement(text).name for text in project["dependencies"]}
    assert not names & {"matplotlib", "rich", "numpy", "pytest", "mypy", "tokenizers"}, names
    assert all("==" not in text for text in project["dependencies"] if "disagg" not in text)
    locked = (ROOT / "images" / "operator.lock").read_text()
    for heavy in ("matplotlib", "numpy", "rich", "pillow"):
        assert f"\n{heavy}==" not in locked, heavy


def test_a_command_that_needs_the_tools_extra_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from disagg.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    with pytest.raises(SystemExit) as exited:
        main(["demo"])
    assert str(exited.value) == (
        "error: disagg demo needs matplotlib: pip install 'disagg-operator[tools]'"
    )


def test_the_dashboard_is_generated_from_its_source() -> None:
    written = CHART / "files" / "dashboards" / f"{dashboards.UID}.json"
    assert written.read_text() == dashboards.as_json(), "run `make manifests`"


def test_every_series_the_dashboard_reads_is_exported_by_the_router_the_operator_or_an_engine() -> (
    None
):
    from prometheus_client import generate_latest

    from disagg.reconcile.metrics import OperatorMetrics
    from disagg.router.metrics import RouterMetrics
    from simengines import engine

    exported = set()
    for registry in (
        OperatorMetrics().registry,
        RouterMetrics().registry,
        engine("decode").metrics.registry,
    ):
        for family in registry.collect():
            exported.add(family.name)
        exported |= set(re.findall(r"^# TYPE (\S+)", generate_latest(registry).decode(), re.M))
    read = set()
    for query in dashboards.queries():
        for name in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query):
            read.add(re.sub(r"_(bucket|sum|count|total)$", "", name))
    assert read and read - exported == set(), "a panel over a series nobody exports is blank"
    panels = dashboards.panels()
    spots = [tuple(p["gridPos"].values()) for p in panels]
    assert len(set(spots)) == len(spots), "two panels in one place"
