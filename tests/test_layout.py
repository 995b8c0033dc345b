"""The package layout promises of DESIGN.md."""

from __future__ import annotations

import importlib
import subprocess
import sys

from conftest import ROOT


def test_operator_dir_is_not_a_package() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_stdlib_operator_module_is_not_shadowed() -> None:
    # Run in a fresh interpreter from the repo root, where a stray operator/__init__.py
    # or a sys.path entry for the repo would shadow the standard library.
    code = (
        "import operator, disagg; "
        "assert operator.itemgetter(1)([0, 7]) == 7; "
        "assert 'site-packages' not in (operator.__file__ or ''), operator.__file__; "
        "print(operator.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "/operator/" not in result.stdout.replace(str(ROOT), "<repo>")
    assert "<repo>" not in result.stdout.replace(str(ROOT), "<repo>")


def test_pure_core_imports_no_io_libraries() -> None:
    forbidden = {"kopf", "kubernetes", "httpx", "aiohttp", "prometheus_api_client"}
    code = (
        "import sys, disagg.api, disagg.naming, disagg.render, disagg.api.crd; "
        f"print(sorted(m for m in {sorted(forbidden)!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_console_script_entry_point_resolves() -> None:
    module = importlib.import_module("disagg.cli")
    assert callable(module.main)
