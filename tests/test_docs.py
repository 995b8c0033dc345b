"""The documentation stays true to the code: the runbook has a section for every condition
and Event reason the operator emits and every exit code of the engine launcher, and every
relative link in the README and docs/ reaches a file and a heading that exist."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

import yaml

from conftest import ROOT
from disagg.api.resource import parse_manifest
from disagg.render import RenderContext, render_all

OPERATOR = ROOT / "operator" / "disagg"
RUNBOOK = ROOT / "docs" / "troubleshooting.md"
REASON = re.compile(r"^[A-Z][A-Za-z0-9]+$")
STATUSES = ("True", "False", "Unknown")


def _strings(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _reason_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Where a reason is written: recorder.warning/normal(body, REASON, ...), a condition's
    third argument, ``reason=``, ``"reason": ...``, ``reason = ...``, a default of a
    ``reason`` parameter, and a (status, REASON, message) tuple."""
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        name = name or (node.func.id if isinstance(node.func, ast.Name) else "")
        if name in ("warning", "normal") and len(node.args) >= 2:
            yield node.args[1]
        if name == "_condition" and len(node.args) >= 3:
            yield node.args[2]
        yield from (k.value for k in node.keywords if k.arg == "reason")
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "reason":
                yield value
    elif isinstance(node, ast.Assign):
        if any(isinstance(t, ast.Name) and t.id == "reason" for t in node.targets):
            yield node.value
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        positional = node.args.args[len(node.args.args) - len(node.args.defaults) :]
        for arg, default in zip(positional, node.args.defaults, strict=True):
            if arg.arg == "reason":
                yield default
    elif isinstance(node, ast.Tuple) and len(node.elts) == 3:
        first = node.elts[0]
        if any(s in STATUSES for s in _strings(first)):
            yield node.elts[1]


def emitted_reasons() -> dict[str, set[str]]:
    """Every reason the operator's code writes to a condition or an Event, with its files."""
    found: dict[str, set[str]] = {}
    for path in OPERATOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            for where in _reason_nodes(node):
                for text in _strings(where):
                    if REASON.match(text) and text not in STATUSES:
                        found.setdefault(text, set()).add(path.name)
    return found


def test_the_runbook_has_a_section_for_every_reason_the_operator_emits() -> None:
    reasons = emitted_reasons()
    # The extractor finds what it should (a guard against it finding nothing).
    assert {"Unschedulable", "SLOBudgetFastBurn", "MetricsUnavailable", "Created"} <= set(reasons)
    headings = re.findall(r"^### (.+)$", RUNBOOK.read_text(), re.M)
    covered = {name.strip() for heading in headings for name in heading.split(",")}
    missing = {r: sorted(files) for r, files in reasons.items() if r not in covered}
    assert not missing, f"docs/troubleshooting.md has no section for {missing}"


def test_the_runbook_explains_every_exit_code_of_the_engine_launcher() -> None:
    launcher = (ROOT / "engine" / "src" / "disagg_engine" / "launcher.py").read_text()
    constants = dict(re.findall(r"^([A-Z_]+) = (\d+)$", launcher, re.M))
    codes = {constants.get(c, c) for c in re.findall(r"sys\.exit\(([A-Z_]+|\d+)\)", launcher)}
    assert codes >= {"2", "78"}, codes
    table = RUNBOOK.read_text()
    for code in codes:
        assert re.search(rf"^\| {code} \|", table, re.M), f"exit code {code} is not in the runbook"


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_docs_reaches_a_file_and_a_heading() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"`[^`\n]*`", "", page.read_text())  # code spans hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and destination.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", destination.read_text(), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


class _NoDuplicates(yaml.SafeLoader):
    """A loader that refuses a key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        repeated = {k for k in keys if keys.count(k) > 1}
        assert not repeated, f"a key given twice: {sorted(map(str, repeated))}"
        return super().construct_mapping(node, deep=deep)


def test_every_model_in_the_docs_validates_and_renders() -> None:
    found = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^```yaml\n(.*?)^```$", page.read_text(), re.M | re.S):
            document = yaml.load(block, Loader=_NoDuplicates)
            if not isinstance(document, dict) or document.get("kind") != "DisaggregatedModel":
                continue
            found += 1
            model = parse_manifest(document)
            assert render_all(RenderContext(model)), page.name
    assert found >= 1, "no DisaggregatedModel in the docs"
