"""Deterministic YAML in and out: the same objects always print byte-identically."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """SafeDumper that indents lists under their key, as kubectl does."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def dump(obj: Any) -> str:
    """One object as YAML, keys in insertion order."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def dump_all(objects: Iterable[Any]) -> str:
    """Several objects as a multi-document YAML stream."""
    return "".join("---\n" + dump(obj) for obj in objects)


def load_all(text: str) -> list[Any]:
    """Every non-empty document of a YAML stream (raises yaml.YAMLError on bad YAML)."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
