"""Install paths: the Helm chart, kubectl apply, least-privilege RBAC, and GitOps co-existence."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg import dashboards
from disagg.devcluster.layout import cache_dir
from harness import ROOT, Kube, Operator, condition, example, wait_for

CHART = ROOT / "charts" / "disagg-operator"
RELEASE = "e2e-disagg-operator"
"""A release name of its own: the demo (run earlier in the suite) leaves `disagg-operator`
installed, and its ClusterRole is cluster-scoped."""
HELM = cache_dir() / "bin" / "helm" / "helm"
sys.path.insert(0, str(ROOT / "manifests"))
import generate  # noqa: E402


def helm(
    *args: str, check: bool = True, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env_args = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    result = subprocess.run(
        [str(HELM), *args, *env_args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr}")
    return result


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_helm_built_here_renders_for_the_kubernetes_it_was_built_with(tmp_path: Path) -> None:
    """Without a cluster, `helm template` fills .Capabilities from the version stamped at build
    time (v1.20 when left unset, which the chart's kubeVersion refuses)."""
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.0.1\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
    )
    (rendered,) = _docs(helm("template", "r", str(chart)).stdout)
    go_mod = (ROOT / "e2e" / "cluster" / "helm" / "go.mod").read_text()
    client_minor = re.search(r"k8s.io/client-go v0\.(\d+)\.", go_mod)
    assert client_minor is not None
    assert rendered["data"]["kube"] == f"v1.{client_minor[1]}.0"
    version = helm("version", "--short").stdout.strip()
    assert version == re.search(r"helm.sh/helm/v3 (v[\d.]+)", go_mod)[1]  # type: ignore[index]


def test_helm_lint_strict() -> None:
    for values in sorted((CHART / "ci").glob("*-values.yaml")):
        result = helm("lint", "--strict", str(CHART), "-f", str(values))
        assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", sorted(p.name for p in (CHART / "ci").glob("*-values.yaml")))
def test_helm_template_with_each_ci_values_file(values: str) -> None:
    docs = _docs(
        helm("template", "r", str(CHART), "-n", "ops", "-f", str(CHART / "ci" / values)).stdout
    )
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "r-disagg-operator") in kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
    if values == "namespaced-values.yaml":
        assert not [d for d in docs if d["kind"] == "ClusterRole"]
    if values == "openshift-values.yaml":
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(pod["securityContext"])
    else:
        assert pod["securityContext"]["runAsUser"] == 65532
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if deployment["spec"]["replicas"] > 1:
        assert [b["spec"]["maxUnavailable"] for b in budgets] == [1]
        assert budgets[0]["spec"]["selector"] == deployment["spec"]["selector"]
    else:
        assert not budgets  # a budget for one replica would block every node drain
        assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"} == {
            "team-a",
            "team-b",
        }
        assert (
            "--namespace=team-a" in container["args"]
            and "--no-leader-election" in container["args"]
        )
        assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    if values == "monitoring-values.yaml":
        monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
        assert "annotations" not in crd["metadata"]
    if values == "extras-values.yaml":
        assert container["args"][-1] == "--verbose"
        assert container["env"][-1] == {
            "name": "SSL_CERT_FILE",
            "value": "/etc/ssl/corporate/ca.pem",
        }
        assert [m["name"] for m in container["volumeMounts"]] == ["tmp", "corporate-ca"]
        assert [v["name"] for v in pod["volumes"]] == ["tmp", "corporate-ca"]
        (spread,) = pod["topologySpreadConstraints"]
        # Left out, the selector is the operator pods' own, so the spread counts them.
        assert (
            spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        )
    if values == "default-values.yaml":
        assert deployment["spec"]["replicas"] == 2 and "--leader-election" in container["args"]
        assert not [d for d in docs if d["kind"] == "ServiceMonitor"], (
            "no Prometheus Operator API here"
        )


def test_chart_crd_equals_the_generated_crd() -> None:
    docs = _docs(helm("template", "r", str(CHART)).stdout)
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    generated = yaml.safe_load((ROOT / "crds" / "disaggregatedmodels.disagg.dev.yaml").read_text())
    assert crd == generated


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("replicaCount=two", "/replicaCount"),
        ("watch.namespaces={Bad_NS}", "/watch/namespaces/0"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("nosuchkey=1", "nosuchkey"),
    ],
)
def test_bad_values_are_rejected_with_a_message(flag: str, message: str) -> None:
    result = helm("template", "r", str(CHART), "--set", flag, check=False)
    assert result.returncode != 0
    assert (
        "values don't meet the specifications of the schema" in result.stderr
        and message in result.stderr
    )


def test_prometheus_tls_and_credentials_become_the_operators_flags_and_mounts() -> None:
    values = [
        "prometheus.url=https://prometheus.example:9090", "prometheus.tls.ca.configMapName=ca",
        "prometheus.tls.clientCertSecretName=client", "prometheus.bearerToken.secretName=tok",
    ]  # fmt: skip
    docs = _docs(helm("template", "r", str(CHART), *(f"--set={v}" for v in values)).stdout)
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "--prometheus-url=https://prometheus.example:9090" in args
    assert f"--prometheus-ca-file={mounts['prometheus-ca']}/ca.crt" in args
    assert f"--prometheus-cert-file={mounts['prometheus-client']}/tls.crt" in args
    assert f"--prometheus-bearer-token-file={mounts['prometheus-token']}/token" in args
    assert volumes["prometheus-ca"]["configMap"]["name"] == "ca"
    assert volumes["prometheus-token"]["secret"]["secretName"] == "tok"
    plain = _docs(helm("template", "r", str(CHART)).stdout)
    default = next(d for d in plain if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert [a for a in default["containers"][0]["args"] if a.startswith("--prometheus")] == [
        "--prometheus-url=http://prometheus-operated.monitoring.svc:9090"
    ]


def test_a_mirror_registry_and_tag_become_the_operators_image_flags() -> None:
    def image_args(*values: str) -> list[str]:
        docs = _docs(helm("template", "r", str(CHART), *(f"--set={v}" for v in values)).stdout)
        pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        return [a for a in pod["containers"][0]["args"] if a.startswith("--image-")]

    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert image_args() == [f"--image-tag={app_version}"]
    mirrored = image_args("dataPlane.imageRegistry=registry.local:5000/ai", "dataPlane.imageTag=x1")
    assert mirrored == ["--image-registry=registry.local:5000/ai", "--image-tag=x1"]
    refused = helm(
        "template", "r", str(CHART), "--set=dataPlane.imageRegistry=Bad Registry", check=False
    )
    assert refused.returncode != 0 and "/dataPlane/imageRegistry" in refused.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["prometheus.basicAuth.username=op"], "username and passwordSecretName go together"),
        (
            ["prometheus.bearerToken.secretName=t", "prometheus.basicAuth.username=op",
             "prometheus.basicAuth.passwordSecretName=p"],
            "set bearerToken or basicAuth, not both",
        ),
        (
            ["prometheus.tls.ca.secretName=a", "prometheus.tls.ca.configMapName=b"],
            "set secretName or configMapName, not both",
        ),
        (["prometheus.url=prometheus:9090"], "/prometheus/url"),
    ],
)  # fmt: skip
def test_prometheus_values_that_cannot_work_are_refused(values: list[str], message: str) -> None:
    result = helm("template", "r", str(CHART), *(f"--set={v}" for v in values), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_install_yaml_is_generated_from_the_chart() -> None:
    committed = (ROOT / "manifests" / "install.yaml").read_text()
    assert committed == generate.install_yaml(str(HELM)), "run `make manifests`"
    kustomization = yaml.safe_load((ROOT / "manifests" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["install.yaml"]


def _sa_kubeconfig(kube: Kube, namespace: str, service_account: str, path: Path) -> Path:
    token = kube.run(
        "create", "token", service_account, "-n", namespace, "--duration=2h"
    ).stdout.strip()
    ca = base64.b64encode((kube.layout.pki / "ca.crt").read_bytes()).decode()
    server = yaml.safe_load(kube.layout.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "certificate-authority-data": ca}}
                ],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
            }
        )
    )
    return path


@pytest.fixture
def release(kube: Kube, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The chart installed by `helm install` (CRD already present); yields (namespace, SA kubeconfig)."""
    namespace = f"disagg-{uuid.uuid4().hex[:6]}"
    kube.run("create", "namespace", namespace)
    # The operator pods must pass the restricted Pod Security profile, enforced by the API server.
    kube.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        namespace,
        "--set",
        "crds.enabled=false",
        "--wait=false",
        kubeconfig=kube.layout.kubeconfig,
    )
    try:
        yield (
            namespace,
            _sa_kubeconfig(kube, namespace, RELEASE, tmp_path / "sa.kubeconfig"),
        )
    finally:
        helm(
            "uninstall",
            RELEASE,
            "-n",
            namespace,
            check=False,
            kubeconfig=kube.layout.kubeconfig,
        )
        kube.run("delete", "namespace", namespace, "--wait=false", check=False)


def _apply_example(kube: Kube, namespace: str, name: str = "minimal") -> dict[str, Any]:
    manifest = example(name)
    kube.apply(yaml.safe_dump(manifest), namespace)
    return manifest


def test_namespace_editors_may_manage_models_and_viewers_may_read_them(
    kube: Kube, release: tuple[str, Path], namespace: str
) -> None:
    # The chart's ClusterRoles join Kubernetes' built-in edit and view roles (through the
    # controller manager's ClusterRole aggregation), so granting those grants models too.
    kube.run("create", "rolebinding", "alice-edits", "--clusterrole=edit", "--user=alice",
             "-n", namespace)  # fmt: skip
    kube.run("create", "rolebinding", "bob-views", "--clusterrole=view", "--user=bob",
             "-n", namespace)  # fmt: skip

    def may(user: str, verb: str) -> bool:
        result = kube.run(
            "auth", "can-i", verb, "disaggregatedmodels.disagg.dev", f"--as={user}",
            "-n", namespace, check=False,
        )  # fmt: skip
        return result.stdout.strip() == "yes"

    wait_for("the edit role to include models", lambda: may("alice", "create"), timeout=60)
    assert may("alice", "delete") and may("alice", "list")
    wait_for("the view role to include models", lambda: may("bob", "list"), timeout=60)
    assert not may("bob", "create") and not may("bob", "delete")
    assert not may("carol", "list")  # no binding, no access


def test_helm_install_runs_the_operator_under_its_own_least_privilege_account(
    kube: Kube, release: tuple[str, Path], namespace: str
) -> None:
    release_ns, sa_kubeconfig = release
    deployment = kube.get("deployment", RELEASE, release_ns)
    assert deployment is not None and deployment["spec"]["replicas"] == 2
    wait_for(
        "the chart's operator pods to be Ready (kwok)",
        lambda: (
            (kube.get("deployment", RELEASE, release_ns) or {})
            .get("status", {})
            .get("readyReplicas")
            == 2
        ),
        timeout=60,
    )
    can = kube.run(
        "auth",
        "can-i",
        "create",
        "secrets",
        f"--as=system:serviceaccount:{release_ns}:{RELEASE}",
        "-n",
        namespace,
        check=False,
    )
    assert can.stdout.strip() == "no"
    operator = Operator(
        kube.layout,
        f"--kubeconfig={sa_kubeconfig}",
        f"--lease-namespace={release_ns}",
        f"--namespace={namespace}",
        "--resync-seconds=3",
        log_name="helm-sa",
    )
    try:
        wait_for(
            "the operator to lead",
            lambda: operator.metrics().get("disagg_operator_leader") == 1.0,
            timeout=30,
        )
        _apply_example(kube, namespace)
        kube.run(
            "wait",
            "--for=condition=Ready",
            "dm/qwen-small",
            "-n",
            namespace,
            "--timeout=60s",
            timeout=90,
        )
        events = [e for e in kube.items("events", namespace) if e["reason"] == "Created"]
        assert events, "the operator posts Events under its account"
        errors = operator.metrics().get('disagg_operator_reconcile_total{result="error"}', 0.0)
        assert errors == 0.0, operator.log_path.read_text()[-2000:]
    finally:
        operator.stop()


RULE_CHECKS = [
    ("disaggregatedmodels", "never reconciles"),
    ("disaggregatedmodels/status", "fails"),
    ("deployments", "fails"),
    ("services", "fails"),
    ("poddisruptionbudgets", "fails"),
    ("roles", "fails"),
    # Without pods the operator may not grant the router's Role (RBAC escalation check):
    # the API server refuses that child, and the model says so.
    ("pods", "degrades"),
    ("events", "posts no events"),
]


def test_removing_any_one_rule_breaks_something(
    kube: Kube, release: tuple[str, Path], namespace: str
) -> None:
    _, sa_kubeconfig = release
    original = kube.get("clusterrole", RELEASE, "")
    assert original is not None
    try:
        for resource, symptom in RULE_CHECKS:
            role = copy.deepcopy(original)
            role["rules"] = [r for r in role["rules"] if resource not in r["resources"]]
            assert len(role["rules"]) == len(original["rules"]) - 1, resource
            for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
                role["metadata"].pop(key, None)
            kube.run("replace", "-f", "-", stdin=json.dumps(role))
            model_ns = f"{namespace}-{resource.split('/')[-1][:8]}"
            kube.run("create", "namespace", model_ns)
            operator = Operator(
                kube.layout,
                f"--kubeconfig={sa_kubeconfig}",
                "--no-leader-election",
                "--resync-seconds=2",
                f"--namespace={model_ns}",
                log_name=f"rbac-{resource.replace('/', '-')}",
            )
            try:
                wait_for(
                    f"the default SA in {model_ns}",
                    lambda ns=model_ns: kube.get("serviceaccount", "default", ns),
                    timeout=30,
                )
                _apply_example(kube, model_ns)
                if symptom == "fails":
                    wait_for(
                        f"a failed reconcile without {resource}",
                        lambda op=operator: (
                            op.metrics().get('disagg_operator_reconcile_total{result="error"}', 0)
                            >= 1
                        ),
                        timeout=30,
                    )
                elif symptom == "degrades":
                    degraded = wait_for(
                        f"Degraded=ApplyRejected without {resource}",
                        lambda ns=model_ns: (
                            cond
                            if (cond := condition(kube.get("dm", "qwen-small", ns), "Degraded"))
                            and cond["reason"] == "ApplyRejected"
                            else None
                        ),
                        timeout=30,
                    )
                    assert "Role qwen-small-router" in degraded["message"], degraded
                    assert "forbidden" in degraded["message"].lower(), degraded
                elif symptom == "never reconciles":
                    wait_for(
                        "the operator to report that it may not list models",
                        lambda op=operator: "forbidden" in op.log_path.read_text().lower(),
                        timeout=30,
                    )
                    assert operator.reconciles() == 0
                    assert condition(kube.get("dm", "qwen-small", model_ns), "Ready") is None
                else:
                    wait_for(
                        "the model to become Ready anyway",
                        lambda ns=model_ns: (
                            (condition(kube.get("dm", "qwen-small", ns), "Ready") or {}).get(
                                "status"
                            )
                            == "True"
                        ),
                        timeout=30,
                    )
                    assert not [
                        e
                        for e in kube.items("events", model_ns)
                        if e.get("source", {}).get("component") == "disagg-operator"
                    ]
            finally:
                operator.stop()
                kube.run("delete", "namespace", model_ns, "--wait=false", check=False)
    finally:
        restored = copy.deepcopy(original)
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            restored["metadata"].pop(key, None)
        kube.run("replace", "-f", "-", stdin=json.dumps(restored))


def test_kubectl_apply_install_yaml_brings_the_operator_up(kube: Kube) -> None:
    result = kube.run(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(ROOT / "manifests" / "install.yaml"),
    )
    assert "deployment.apps/disagg-operator serverside-applied" in result.stdout
    try:
        wait_for(
            "the operator Deployment to be available",
            lambda: (
                (kube.get("deployment", "disagg-operator", "disagg-system") or {})
                .get("status", {})
                .get("readyReplicas")
                == 2
            ),
            timeout=60,
        )
        sa = kube.get("serviceaccount", "disagg-operator", "disagg-system")
        assert sa is not None
        ns = kube.get("namespace", "disagg-system", "")
        assert (
            ns is not None
            and ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        )
    finally:
        docs = [
            d
            for d in _docs((ROOT / "manifests" / "install.yaml").read_text())
            if d["kind"] not in ("CustomResourceDefinition",)
        ]
        kube.run(
            "delete",
            "--ignore-not-found",
            "--wait=false",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(docs),
            check=False,
        )


def test_gitops_reapply_after_the_operator_worked_changes_nothing(
    kube: Kube, operator: Operator, namespace: str
) -> None:
    manifest = _example_with_autoscaling()
    applied = yaml.safe_dump(manifest)
    kube.apply(applied, namespace, "--server-side", "--field-manager=argocd-controller")
    kube.run(
        "wait", "--for=condition=Ready", "dm/llama-8b", "-n", namespace, "--timeout=60s", timeout=90
    )
    before = kube.get("dm", "llama-8b", namespace)
    assert before is not None
    # A GitOps tool syncing the same file again: no conflict, no change to what Git holds.
    for _ in range(2):
        result = kube.apply(
            applied, namespace, "--server-side", "--field-manager=argocd-controller"
        )
        assert result.returncode == 0 and "conflict" not in result.stderr.lower()
    after = kube.get("dm", "llama-8b", namespace)
    assert after is not None
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]
    fields = kube.json("get", "dm", "llama-8b", "-n", namespace, "--show-managed-fields")[
        "metadata"
    ]["managedFields"]
    managers = {m["manager"]: m for m in fields}
    assert managers["disagg-operator"]["subresource"] == "status", "the operator writes only status"
    assert "kopf.zalando.org/last-handled-configuration" not in after["metadata"].get(
        "annotations", {}
    )
    assert not after["metadata"].get("finalizers")
    diff = kube.run(
        "diff",
        "--server-side",
        "--field-manager=argocd-controller",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=applied,
        check=False,
    )
    assert diff.returncode == 0, f"a GitOps diff would show drift:\n{diff.stdout}"


def _example_with_autoscaling() -> dict[str, Any]:
    return example("llama-8b-nixl-rdma")


def _series(labels: str, values: str) -> dict[str, str]:
    return {"series": labels, "values": values}


def _burn_alert(model: str, kind: str, burn: str) -> dict[str, Any]:
    """What the chart's rule says of a model burning its TTFT budget (``kind``: fast, slow)."""
    where = f"team-a/{model}"
    fast = kind == "fast"
    over = (
        "the last hour (2% of the window's budget per hour or more). See kubectl describe dm: "
        "status.sloBudget, the pools' lastScaleReason and the ScalingLimited condition."
        if fast
        else "the last six hours (5% of the window's budget in six hours or more)."
    )
    return {
        "exp_labels": {"severity": "critical" if fast else "warning",
                       "model_namespace": "team-a", "model": model, "slo": "ttft"},
        "exp_annotations": {
            "summary": f"{where}: the ttft SLO's error budget is burning{' fast' if fast else ''}",
            "description": f"The ttft p99 SLO of DisaggregatedModel {where} is missed {burn}x as "
            f"often as its budget allows over {over}",
        },
    }  # fmt: skip


def _rules(tmp_path: Path) -> None:
    (rule,) = [
        d
        for d in _docs(helm("template", "r", str(CHART), "--set",
                            "metrics.prometheusRule.enabled=true").stdout)
        if d["kind"] == "PrometheusRule"
    ]  # fmt: skip
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))


def _promtool_test(tmp_path: Path, series: list[dict[str, str]], alerts: list[Any]) -> None:
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    _promtool("test", tmp_path / "tests.yaml", timeout=120)


def _promtool(verb: str, rules: Path, timeout: float) -> None:
    """``promtool <verb> rules <file>`` (Debian's), which must pass."""
    result = subprocess.run(
        ["promtool", verb, "rules", str(rules)],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_slo_burn_rate_alerts_page_on_what_the_operator_counts(tmp_path: Path) -> None:
    """The chart's PrometheusRule, as rendered, under Debian's promtool: a fast burn pages,
    a slow one files a ticket, a model within its budget is left alone, and an autoscaler
    that cannot read its metrics is reported. Series are what the operator exports."""
    _rules(tmp_path)
    window = 672 * 3600  # the default sloWindow: a page at 13.44x, a ticket at 5.6x

    def model(name: str, missed_per_minute: int, blind: bool = False) -> list[dict[str, str]]:
        labels = f'model_namespace="team-a",model="{name}"'
        ttft = f'{labels},slo="ttft"'
        return [
            _series(f"disagg_slo_requests_total{{{ttft}}}", "0+600x420"),  # 10 req/s for 7 h
            _series(f"disagg_slo_missed_total{{{ttft}}}", f"0+{missed_per_minute}x420"),
            _series(f"disagg_slo_window_seconds{{{labels}}}", f"{window}x420"),
            # Blind: Prometheus unreachable from 371 minutes in.
            _series(
                f"disagg_autoscaler_metrics_unavailable{{{labels}}}",
                "0x370 1x49" if blind else "0x420",
            ),
        ]

    # 20% missed: 20x, past the page; 8%: past the ticket only; 0.5%: within its budget.
    series = [*model("burning", 120), *model("leaking", 48), *model("steady", 3),
              *model("blind", 0, blind=True)]  # fmt: skip
    blind = {
        "exp_labels": {"severity": "warning", "model_namespace": "team-a", "model": "blind"},
        "exp_annotations": {
            "summary": "team-a/blind: the autoscaler cannot read its metrics",
            "description": "The built-in autoscaler has held the replicas of DisaggregatedModel "
            "team-a/blind for 10 minutes because it cannot read Prometheus (the ScalingActive "
            "condition's message says why).",
        },
    }
    _promtool_test(tmp_path, series, [
        {"eval_time": "390m", "alertname": "DisaggSLOBudgetFastBurn",
         "exp_alerts": [_burn_alert("burning", "fast", "20.0")]},
        {"eval_time": "390m", "alertname": "DisaggSLOBudgetSlowBurn",
         "exp_alerts": [_burn_alert("burning", "slow", "20.0"),
                        _burn_alert("leaking", "slow", "8.0")]},
        {"eval_time": "390m", "alertname": "DisaggAutoscalerMetricsUnavailable",
         "exp_alerts": [blind]},
        # A minute into the burn the page waits for its `for`.
        {"eval_time": "1m", "alertname": "DisaggSLOBudgetFastBurn", "exp_alerts": []},
    ])  # fmt: skip


def test_a_pool_capped_while_over_its_slo_and_decode_only_fallbacks_alert(tmp_path: Path) -> None:
    """The pool alert fires only at the maximum and over the SLO; the data-path alert only
    past 5% of the requests decoded without a KV hand-off. Series are what the operator and
    the router pods export."""
    _rules(tmp_path)

    def pool(model: str, desired: int, pressure: float) -> list[dict[str, str]]:
        labels = f'model_namespace="team-a",model="{model}",pool="prefill"'
        return [
            _series(f'disagg_pool_replicas{{{labels},state="desired"}}', f"{desired}x40"),
            _series(f'disagg_pool_replicas{{{labels},state="ready"}}', f"{desired}x40"),
            _series(f'disagg_pool_replica_bounds{{{labels},bound="max"}}', "8x40"),
            _series(f'disagg_pool_replica_bounds{{{labels},bound="min"}}', "1x40"),
            _series(f"disagg_pool_slo_pressure{{{labels}}}", f"{pressure}x40"),
        ]

    def router(model: str, fallback_per_minute: int) -> list[dict[str, str]]:
        labels = f'namespace="team-a",disagg_model="{model}",disagg_role="router"'
        split = 600 - fallback_per_minute
        return [
            _series(f'disagg_router_requests_total{{{labels},path="disaggregated",code="200"}}',
                    f"0+{split}x40"),
            _series(f'disagg_router_requests_total{{{labels},path="fallback",code="200"}}',
                    f"0+{fallback_per_minute}x40"),
        ]  # fmt: skip

    series = [
        *pool("capped", 8, 1.4), *pool("growing", 3, 1.4), *pool("enough", 8, 0.7),
        *router("flaky", 60), *router("healthy", 6),
    ]  # fmt: skip
    capped = {
        "exp_labels": {"severity": "warning", "model_namespace": "team-a", "model": "capped",
                       "pool": "prefill"},
        "exp_annotations": {
            "summary": "team-a/capped: the prefill pool is at its maximum and over its SLO",
            "description": "The autoscaler wants the prefill pool of DisaggregatedModel "
            "team-a/capped at its maxReplicas and it is still 1.40x its SLO, for 10 minutes: "
            "raise spec.prefill.autoscaling.maxReplicas (and autoscaling.maxTotalGPUs, if set), "
            "or see the pool's lastScaleReason for requests that miss at any size.",
        },
    }  # fmt: skip
    flaky = {
        "exp_labels": {"severity": "warning", "namespace": "team-a", "disagg_model": "flaky"},
        "exp_annotations": {
            "summary": "team-a/flaky: requests fall back to decode-only",
            "description": "10% of the requests to DisaggregatedModel team-a/flaky over 10 "
            "minutes were decoded without a KV hand-off: a prefill failed or timed out, no "
            "prefill engine was ready, or the decode engine could not load the KV. Their TTFT "
            "and every decode step beside them pay for it. See "
            "disagg_router_upstream_failures_total by role, the engines' logs and "
            "docs/troubleshooting.md.",
        },
    }  # fmt: skip
    _promtool_test(tmp_path, series, [
        {"eval_time": "30m", "alertname": "DisaggPoolAtMaximumOverSLO", "exp_alerts": [capped]},
        {"eval_time": "30m", "alertname": "DisaggKVTransferFallback", "exp_alerts": [flaky]},
        # Within the `for`, neither has fired yet.
        {"eval_time": "5m", "alertname": "DisaggPoolAtMaximumOverSLO", "exp_alerts": []},
        {"eval_time": "5m", "alertname": "DisaggKVTransferFallback", "exp_alerts": []},
    ])  # fmt: skip


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """Each panel's and annotation's PromQL, with Grafana's variables filled in, checked by
    Debian's promtool as it checks recording rules."""
    queries = dashboards.queries()
    assert len(queries) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"disagg:dashboard_query_{i}", "expr": dashboards.fill(q, "team-a", "m", "5m")}
        for i, q in enumerate(queries)
    ]}]}  # fmt: skip
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(rules))
    _promtool("check", tmp_path / "queries.yaml", timeout=60)


PROMETHEUS_OPERATOR_CRDS = cache_dir() / "crds" / "prometheus-operator"


@pytest.fixture
def prometheus_operator_crds(kube: Kube) -> Iterator[None]:
    """The Prometheus Operator's CRDs (from its Go module, e2e/cluster/prometheus-operator.version),
    removed afterwards: other tests install the chart where that API is absent."""
    files = sorted(PROMETHEUS_OPERATOR_CRDS.glob("*.yaml"))
    if len(files) != 3:
        pytest.fail(
            f"the Prometheus Operator's CRDs are missing in {PROMETHEUS_OPERATOR_CRDS}: run `make binaries`"
        )
    for crd in files:
        kube.run("apply", "--server-side", "-f", str(crd))
    for kind in ("prometheusrules", "servicemonitors", "podmonitors"):
        kube.wait_established(f"{kind}.monitoring.coreos.com")
    yield
    for crd in files:
        kube.run("delete", "-f", str(crd), "--wait=false", check=False)


def test_dashboards_and_alerts_render_objects_the_api_server_accepts(
    kube: Kube, prometheus_operator_crds: None
) -> None:
    """The chart's dashboards, PrometheusRule, ServiceMonitor and PodMonitor, switched on,
    pass a server-side dry run against the Prometheus Operator's own CRDs."""
    rendered = helm(
        "template", "r", str(CHART), "-n", "default",
        "--set", "metrics.dashboards.enabled=true",
        "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.enginePodMonitor.enabled=true",
        "--set", "metrics.dashboards.annotations.grafana_folder=LLM serving",
    ).stdout  # fmt: skip
    kinds = ("ConfigMap", "PrometheusRule", "ServiceMonitor", "PodMonitor")
    docs = [d for d in _docs(rendered) if d["kind"] in kinds]
    assert sorted(d["kind"] for d in docs) == sorted(kinds)
    (board,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    assert json.loads(board["data"]["disagg-model.json"]) == dashboards.dashboard()
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    roles = monitor["spec"]["selector"]["matchExpressions"][1]["values"]
    assert "router" in roles, "the dashboards and the fallback alert read the router's paths"
    result = kube.run(
        "apply", "--dry-run=server", "--server-side", "-f", "-",
        stdin=yaml.safe_dump_all(docs), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
