"""How deep a parsed JSON or YAML value nests, measured without recursion (pure).

Request bodies and manifests come from outside and can nest deeper than the stack of anything
that walks them recursively (deepcopy, pydantic, the YAML dumper): the router and the manifest
check both measure them here first.
"""

from __future__ import annotations


def _children(value: object) -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, list):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return []


def levels(value: object) -> int:
    """Keys and indexes on the longest path below ``value`` (0 for a scalar or an empty one)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        stack += [(child, depth + 1) for _, child in _children(item)]
    return deepest


def path_deeper_than(value: object, limit: int) -> tuple[str, ...] | None:
    """The keys and indexes (``[i]``) of the first path longer than ``limit``, or None."""
    if levels(value) <= limit:
        return None
    stack: list[tuple[object, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > limit:
            return path
        stack += [(child, (*path, key)) for key, child in _children(item)]
    return None
