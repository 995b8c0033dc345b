"""The CRD is generated from the models, structural, and committed without drift."""

from __future__ import annotations

from typing import Any

from conftest import ROOT
from disagg.api.crd import CRD_FILE_NAME, CRD_HEADER, build_crd
from disagg.api.reference import reference_markdown
from disagg.yamlio import dump


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found += _walk(value, f"{path}.{key}")
        if "items" in node:
            found += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_the_api_reference_is_generated_from_the_models() -> None:
    committed = (ROOT / "docs" / "reference.md").read_text()
    assert committed == reference_markdown(), "docs/reference.md is stale: run `make crds`"
    for field in ("`spec.autoscaling.sloWindow`", "`spec.decode.pod.volumes[].secret.secretName`"):
        assert field in committed
    assert "with the nixl and mooncake connectors" in committed  # a rule, in words


def test_committed_crd_matches_the_models() -> None:
    committed = (ROOT / "crds" / CRD_FILE_NAME).read_text()
    assert committed == CRD_HEADER + dump(build_crd()), "crds/ is stale: run `make crds`"


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        if node.get("type") == "object":
            has_shape = "properties" in node or "additionalProperties" in node
            assert (
                has_shape
                or node.get("x-kubernetes-preserve-unknown-fields")
                or path == (".metadata")
            ), path


def test_every_spec_and_status_field_is_described() -> None:
    for path, node in _walk(_schema()):
        if path.startswith((".spec.", ".status.")) and not path.endswith(("{}", "[]")):
            assert node.get("description"), f"{path} has no description for kubectl explain"


def test_names_columns_and_subresources() -> None:
    crd = build_crd()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "disaggregatedmodels.disagg.dev"
    assert names["shortNames"] == ["dm"] and names["categories"] == ["disagg"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Ready", "Mode", "Prefill", "Decode", "Engine", "TTFT", "TPOT", "Budget", "Age",
    ]  # fmt: skip


def test_cel_rules_are_attached_where_the_schema_cannot_say_it() -> None:
    schema = _schema()
    spec = schema["properties"]["spec"]
    rules = {r["rule"]: r for r in spec["x-kubernetes-validations"]}
    assert any(
        "self.prefill.tensorParallelSize % self.decode.tensorParallelSize" in r for r in rules
    )
    assert any("['nixl', 'mooncake']" in r for r in rules)
    pool_rules = spec["properties"]["prefill"]["properties"]["autoscaling"]
    assert (
        pool_rules["x-kubernetes-validations"][0]["rule"] == "self.minReplicas <= self.maxReplicas"
    )
    network = [r["rule"] for r in spec["properties"]["network"]["x-kubernetes-validations"]]
    assert "self.transport == 'rdma' || !has(self.rdma)" in network
    slo_rules = [r["rule"] for r in spec["properties"]["autoscaling"]["x-kubernetes-validations"]]
    assert "duration(self.ttftP99) > duration('0s')" in slo_rules


def test_nested_objects_default_so_the_api_server_fills_them() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    # The whole default object: the API server checks defaults against the CEL rules as is.
    assert spec["prefill"]["default"]["autoscaling"] == {"minReplicas": 1, "maxReplicas": 8}
    assert spec["autoscaling"]["default"]["ttftP99"] == "2s"
    assert spec["prefill"]["properties"]["tensorParallelSize"]["default"] == 1
    assert "default" not in spec["network"]["properties"]["rdma"], "rdma presence is meaningful"
    quantity = spec["network"]["properties"]["shmSize"]
    assert quantity["x-kubernetes-int-or-string"] is True and "type" not in quantity


def test_exclusive_bounds_are_written_as_openapi_v3_0_reads_them() -> None:
    # The API server refuses a CRD whose exclusiveMinimum is a number (JSON Schema's form).
    bounded = [(path, node) for path, node in _walk(_schema()) if "exclusiveMinimum" in node]
    assert bounded, "router.prefillOffload.waitFraction has one"
    for path, node in bounded:
        assert node["exclusiveMinimum"] is True and node["minimum"] == 0, path
    assert not [path for path, node in _walk(_schema()) if "exclusiveMaximum" in node]
