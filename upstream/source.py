"""Reading a pinned engine release without importing it: fetching it from PyPI and the
`ast` helpers `facts.py` reads facts with.

A release file comes from PyPI's JSON simple index, is checked against the sha256 the index
publishes and is cached in $DISAGG_CACHE/upstream (~/.cache/disagg/upstream). The sdist is
preferred; a release with none (SGLang 0.5.23) is read from its CPython 3.11 x86_64 wheel,
whose Python sources are the same files.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("DISAGG_CACHE", Path.home() / ".cache" / "disagg")) / "upstream"
INDEX = "https://pypi.org/simple/{name}/"
TIMEOUT_SECONDS = 120


class FactError(RuntimeError):
    """The source no longer has the shape a fact is read from; the message says where."""


def _distribution(name: str, version: str) -> tuple[str, str, str]:
    """(filename, url, sha256) of the release file to read: the sdist, else a py3.11 wheel."""
    request = urllib.request.Request(
        INDEX.format(name=name), headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
        files = json.load(response)["files"]

    def wanted(filename: str) -> int | None:
        if filename == f"{name}-{version}.tar.gz":
            return 0
        wheel = filename.startswith(f"{name}-{version}-cp311-cp311-manylinux")
        return 1 if wheel and filename.endswith("x86_64.whl") else None

    ranked = sorted(
        (rank, entry["filename"], entry["url"], entry["hashes"]["sha256"])
        for entry in files
        if (rank := wanted(entry["filename"])) is not None
    )
    if ranked:
        return ranked[0][1], ranked[0][2], ranked[0][3]
    raise FactError(f"PyPI has no sdist or cp311 x86_64 wheel of {name} {version}")


def fetch(name: str, version: str) -> Path:
    """The cached release file of name==version, downloaded and verified when missing. What
    the index said is cached beside it, so a warm cache needs no network."""
    record = CACHE / f"{name}-{version}.index.json"
    if record.exists():
        filename, url, sha256 = json.loads(record.read_text())
    else:
        filename, url, sha256 = _distribution(name, version)
    path = CACHE / filename
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise FactError(f"{filename}: sha256 differs from the one PyPI's index publishes")
    path.write_bytes(data)
    record.write_text(json.dumps([filename, url, sha256]))
    return path


class Source:
    """The Python files of one release file, read by their path inside the package."""

    def __init__(self, archive: Path, package: str) -> None:
        self.archive = archive
        self.files: dict[str, bytes] = {}
        if archive.name.endswith(".tar.gz"):
            with tarfile.open(archive) as tar:
                for member in tar.getmembers():
                    inner = member.name.split("/", 1)[-1]
                    if member.isfile() and inner.startswith(f"{package}/"):
                        handle = tar.extractfile(member)
                        if handle is not None and inner.endswith(".py"):
                            self.files[inner] = handle.read()
        else:
            with zipfile.ZipFile(io.BytesIO(archive.read_bytes())) as wheel:
                for inner in wheel.namelist():
                    if inner.startswith(f"{package}/") and inner.endswith(".py"):
                        self.files[inner] = wheel.read(inner)

    def tree(self, path: str) -> ast.Module:
        if path not in self.files:
            raise FactError(f"{self.archive.name} has no {path}")
        return ast.parse(self.files[path], filename=path)

    def under(self, folder: str) -> Iterator[tuple[str, ast.Module]]:
        for path in sorted(self.files):
            if path.startswith(folder) and not path.endswith("__init__.py"):
                yield path, self.tree(path)


def calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def name_of(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def subscript_items(node: ast.Subscript) -> list[ast.expr]:
    """The expressions inside `X[a, b]` (or `[a]` for `X[a]`)."""
    inner = node.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def option_literals(tree: ast.AST) -> set[str]:
    """Every literal '--flag' passed to an add_argument call."""
    return {
        arg.value
        for call in calls(tree)
        if name_of(call.func) == "add_argument"
        for arg in call.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        if arg.value.startswith("--")
    }


def find_class(tree: ast.Module, name: str, path: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise FactError(f"{path}: class {name} is gone")


def fields(cls: ast.ClassDef) -> list[ast.AnnAssign]:
    return [
        node
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and not node.target.id.startswith("_")
    ]


def field_name(node: ast.AnnAssign) -> str:
    assert isinstance(node.target, ast.Name)
    return node.target.id


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def module_literals(tree: ast.Module) -> dict[str, Any]:
    """Module-level NAME = <literal> (annotated or not)."""
    found: dict[str, Any] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found
