"""Deterministic YAML in and out: the same objects always print byte-identically.

Reading is bounded: a document whose aliases expand past MAX_NODES nodes (a "billion laughs"
bomb is a few hundred bytes) or that nests deeper than MAX_DEPTH is refused with a
:class:`YamlLimitError` before anything is built from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import yaml

MAX_NODES: Final = 200_000
"""Nodes a document may expand to, aliases counted every time they are used."""
MAX_DEPTH: Final = 100
"""Deepest nesting of a document: a DisaggregatedModel needs about 15."""


class YamlLimitError(yaml.YAMLError):
    """The document is too large or too deep once its aliases are expanded."""


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
    """Every non-empty document of a YAML stream (raises yaml.YAMLError on bad YAML,
    YamlLimitError on a document too large or deep to be a manifest)."""
    loader = yaml.SafeLoader(text)
    documents: list[Any] = []
    try:
        while loader.check_node():
            try:
                node = loader.get_node()
            except RecursionError:
                raise YamlLimitError(
                    f"document {len(documents) + 1} nests deeper than {MAX_DEPTH} levels"
                ) from None
            if node is None:
                continue
            _check_size(node, len(documents) + 1)
            document = loader.construct_document(node)
            if document is not None:
                documents.append(document)
    finally:
        loader.dispose()
    return documents


def _check_size(root: yaml.Node, number: int) -> None:
    """Count the nodes the document expands to, and its depth, without recursion."""
    nodes = 0
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise YamlLimitError(f"document {number} nests deeper than {MAX_DEPTH} levels")
        if nodes > MAX_NODES:
            raise YamlLimitError(
                f"document {number} expands to more than {MAX_NODES} nodes (aliases counted "
                "each time they are used); a manifest is far smaller"
            )
        if isinstance(node, yaml.SequenceNode):
            stack += [(child, depth + 1) for child in node.value]
        elif isinstance(node, yaml.MappingNode):
            stack += [(part, depth + 1) for pair in node.value for part in pair]
