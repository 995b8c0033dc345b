"""What the chart's values.yaml says about itself: its values table and its JSON schema.

Both come from the comments of values.yaml, so a value is described and constrained in one
place, beside its default:

* the comment lines above a key describe it; keys that follow it at the same depth with no
  comment or blank line between share that description;
* a comment line `@schema {...}` holds JSON merged into the schema inferred from the default
  (the type from the value, a map's keys as its closed set of properties). `"required": true`
  puts the key in its map's `required`; an `additionalProperties` makes the map free-form
  (its default keys are examples, not the whole set); a `oneOf`/`anyOf` replaces the
  inferred type.

Pure: text in, rows and a schema out. `generate.py` writes values.schema.json and the chart
README from them, and a test fails when the committed files differ.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?: (?P<value>.*))?$")
_ANNOTATION = "@schema"
_ALTERNATIVES = ("oneOf", "anyOf")


class ValuesDocError(ValueError):
    """A values.yaml comment the generator cannot use; the message names the line."""


@dataclass(frozen=True)
class Key:
    path: tuple[str, ...]
    default: str  # as written; empty for a map
    description: str
    schema: dict[str, Any] = field(default_factory=dict)

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def keys(values_yaml: str) -> list[Key]:
    """Every key of values.yaml in file order, with its description and annotation."""
    found: list[Key] = []
    comment: list[str] = []
    annotation: dict[str, Any] = {}
    path: list[tuple[int, str]] = []
    previous: tuple[int, str] | None = None
    for number, line in enumerate(values_yaml.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            comment, annotation, previous = [], {}, None
        elif stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if text.startswith(_ANNOTATION):
                annotation |= _parse_annotation(text[len(_ANNOTATION) :], number)
            else:
                comment.append(text)
        elif match := _KEY.match(line):
            indent = len(match["indent"])
            path = [(i, k) for i, k in path if i < indent] + [(indent, match["key"])]
            description = " ".join(comment)
            if not description and previous is not None and previous[0] == indent:
                description = previous[1]
            found.append(
                Key(tuple(k for _, k in path), match["value"] or "", description, annotation)
            )
            comment, annotation, previous = [], {}, (indent, description)
    return found


def _parse_annotation(text: str, line: int) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValuesDocError(f"values.yaml line {line}: @schema is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ValuesDocError(f"values.yaml line {line}: @schema must be a JSON object")
    return parsed


def values_table(values_yaml: str) -> list[tuple[str, str, str]]:
    """(dotted key, default as written, description) for every key, in file order."""
    return [(key.dotted, key.default, key.description) for key in keys(values_yaml)]


def values_schema(values_yaml: str, title: str) -> dict[str, Any]:
    """The JSON schema (draft-07) of the chart's values: closed maps, so a mistyped key fails
    `helm install` with a message, and `global`, which Helm passes to every chart."""
    notes = {key.path: key for key in keys(values_yaml)}
    values = yaml.safe_load(values_yaml)
    if not isinstance(values, dict):
        raise ValuesDocError("values.yaml must be a map")
    unread = [".".join(p) for p in _paths(values) if p not in notes]
    if unread:
        raise ValuesDocError(f"values.yaml keys the line reader missed: {', '.join(unread)}")
    root = _schema(values, (), notes)
    root["properties"] = {"global": {"type": "object"}} | root["properties"]
    return {"$schema": "https://json-schema.org/draft-07/schema#", "title": title} | root


def _paths(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, value in values.items():
        found.append((*prefix, name))
        if isinstance(value, dict):
            found += _paths(value, (*prefix, name))
    return found


def _schema(value: Any, path: tuple[str, ...], notes: dict[tuple[str, ...], Key]) -> dict[str, Any]:
    note = notes.get(path)
    annotation = {k: v for k, v in (note.schema if note else {}).items() if k != "required"}
    typed = "type" in annotation or any(k in annotation for k in _ALTERNATIVES)
    schema: dict[str, Any] = {} if typed else {"type": _json_type(value, path)}
    if isinstance(value, dict) and value and "additionalProperties" not in annotation:
        schema["additionalProperties"] = False
        required = [name for name in value if notes[(*path, name)].schema.get("required") is True]
        if required:
            schema["required"] = required
        schema["properties"] = {
            name: _schema(child, (*path, name), notes) for name, child in value.items()
        }
    schema |= annotation
    if note and note.description:
        schema["description"] = note.description
    return schema


def _json_type(value: Any, path: tuple[str, ...]) -> str:
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, kind):
            return name
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    raise ValuesDocError(
        f"values.yaml {'.'.join(path)}: a null default has no type; give it one with @schema"
    )
