"""Shared fixtures of the fast suite: paths and example manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "manifests" / "examples"


def example_paths() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def load_example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return loaded


@pytest.fixture
def minimal() -> dict[str, Any]:
    return load_example("minimal")
