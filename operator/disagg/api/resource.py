"""The DisaggregatedModel resource as a whole, and turning a manifest into it.

:func:`parse_model` is the one entry point for untrusted input (a file, a watch event): it
returns the typed model or raises :class:`ManifestError` whose lines each name a field path
and what is wrong with it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from disagg.api.container import CONTAINER_PATTERN_MEANINGS
from disagg.api.gateway import GATEWAY_PATTERN_MEANINGS
from disagg.api.metadata import Metadata
from disagg.api.pod import POD_PATTERN_MEANINGS
from disagg.api.scheduling import SCHEDULING_PATTERN_MEANINGS
from disagg.api.schema import model_schema
from disagg.api.spec import DisaggregatedModelSpec
from disagg.api.status import DisaggregatedModelStatus
from disagg.nesting import path_deeper_than

GROUP: Final = "disagg.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DisaggregatedModel"
PLURAL: Final = "disaggregatedmodels"
SINGULAR: Final = "disaggregatedmodel"
SHORT_NAMES: Final = ("dm",)
CATEGORIES: Final = ("disagg",)

NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH: Final = 63


class DisaggregatedModel(BaseModel):
    """One DisaggregatedModel object as the user wrote it: metadata and spec (its status is
    the operator's, read on its own: see :func:`parse_model`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: Metadata
    spec: DisaggregatedModelSpec


class ManifestError(ValueError):
    """A manifest that is not a valid DisaggregatedModel; ``problems`` name each field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _camel_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


PATTERN_MEANINGS = {
    **SCHEDULING_PATTERN_MEANINGS,
    **CONTAINER_PATTERN_MEANINGS,
    **POD_PATTERN_MEANINGS,
    **GATEWAY_PATTERN_MEANINGS,
}
"""What each pattern means, for error messages (the regular expression is not a message)."""


def format_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: ``<field path>: <what is wrong>``."""
    lines = []
    for item in error.errors():
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and "[" in p))
        path = _camel_path(loc)
        ctx = item.get("ctx") or {}
        if item["type"] == "rule":
            path += str(ctx.get("field_path", ""))
            message = str(item["msg"])
        elif item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "required field is missing"
        elif item["type"] == "string_pattern_mismatch" and ctx.get("pattern") in PATTERN_MEANINGS:
            message = f"{PATTERN_MEANINGS[ctx['pattern']]} (got {item.get('input')!r})"
        elif item["type"] in ("dict_type", "model_type", "model_attributes_type"):
            message = f"expected a mapping, got {_json_type(item.get('input'))}"
        else:
            message = item["msg"].removeprefix("Value error, ")
            if "input" in item and not isinstance(item["input"], dict | list):
                message += f" (got {item['input']!r})"
        full = ".".join(p for p in (prefix, path) if p)
        lines.append(f"{full or '<root>'}: {message}")
    return lines


def _json_type(value: object) -> str:
    """A value's type as a manifest's author knows it (JSON's names, not Python's)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string ({value!r})"
    return "a list" if isinstance(value, list) else type(value).__name__


def parse_model(manifest: object, notes: list[str] | None = None) -> DisaggregatedModel:
    """Validate a manifest (a parsed YAML/JSON document), without its status, into a
    :class:`DisaggregatedModel`, reading it as the API server reads a create (``kubectl
    apply`` of a new object, ``kubectl create``): nulls the structural schema prunes are
    dropped, and a whole number written as ``2.0`` is an integer where no rule reads it.
    Where ``kubectl apply --server-side`` would judge otherwise (it refuses nulls), a line
    goes to ``notes``."""
    if not isinstance(manifest, dict):
        raise ManifestError([f"<root>: expected a mapping, got {type(manifest).__name__}"])
    # Status is left out, as the API server leaves it out of a create (the CRD has a status
    # subresource: apiextensions' PrepareForCreate deletes it before validating) and keeps
    # it out of an update. It is the operator's to write, perhaps by another version (a
    # rollback finds fields there it does not know), and it is read on its own
    # (disagg.status.previous_status, disagg.autoscale.recall.recalled): validated with the
    # spec, it made a model InvalidSpec, and stopped reconciling it, for nothing the user
    # wrote. (A manifest's status is judged by parse_manifest.)
    manifest = {key: value for key, value in manifest.items() if key != "status"}
    problems = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: expected {API_VERSION!r}, got {manifest.get('apiVersion')!r}")
    if manifest.get("kind") != KIND:
        problems.append(f"kind: expected {KIND!r}, got {manifest.get('kind')!r}")
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: required field is missing")
    elif len(name) > NAME_MAX_LENGTH or not re.fullmatch(NAME_PATTERN, name):
        problems.append(f"metadata.name: {METADATA_NAME_RULE_MESSAGE} (got {name!r})")
    too_deep = _too_deep(manifest)
    if too_deep is not None:
        problems.append(
            f"{too_deep}: nested deeper than {MAX_MANIFEST_DEPTH} levels; no Kubernetes field "
            "needs that many"
        )
    if problems:
        raise ManifestError(problems)
    if isinstance(manifest.get("spec"), dict):
        nulls: list[str] = []
        spec = as_created(manifest["spec"], api_schema(DisaggregatedModelSpec), "spec", nulls)
        if notes is not None:
            notes += [
                f"{path}: null, left out as kubectl apply and kubectl create leave it out "
                "(kubectl apply --server-side refuses it)"
                for path in nulls
            ]
        manifest = {**manifest, "spec": spec}
    try:
        return DisaggregatedModel.model_validate(manifest)
    except ValidationError as error:
        raise ManifestError(format_validation_error(error)) from error


def parse_manifest(manifest: object, notes: list[str] | None = None) -> DisaggregatedModel:
    """A manifest a user applies, judged as ``kubectl apply`` sends it (strict field
    validation, its default): :func:`parse_model`, and a ``status`` with no field its schema
    lacks. The operator reads stored objects with :func:`parse_model`, which never judges a
    status (one written by another operator version must not stop a model)."""
    if isinstance(manifest, dict):
        status = api_schema(DisaggregatedModelStatus)
        undeclared = unknown_fields(manifest.get("status"), status, "status")
        if undeclared:
            raise ManifestError(
                [
                    f"{path}: unknown field (status is the operator's to write; strict field "
                    "validation, kubectl's default, refuses a field its schema lacks)"
                    for path in undeclared
                ]
            )
    return parse_model(manifest, notes)


def known_fields(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` with the fields ``schema`` does not describe left out, as the API server
    prunes what a CRD's structural schema does not know (pure)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and schema.get("type") == "object":
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties is None:
            if isinstance(extra, dict):
                return {key: known_fields(item, extra) for key, item in value.items()}
            return value
        return {
            key: known_fields(item, properties[key])
            for key, item in value.items()
            if key in properties
        }
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [known_fields(item, schema["items"]) for item in value]
    return value


@functools.cache
def api_schema(
    part: type[DisaggregatedModelSpec] | type[DisaggregatedModelStatus],
) -> dict[str, Any]:
    """The CRD's structural schema of ``spec`` or ``status``, built once (read, never changed)."""
    return model_schema(part)


def _field_schema(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of field ``key`` of an object (its own, or the map's value schema)."""
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    sub = properties.get(key, extra if isinstance(extra, dict) else None)
    return sub if isinstance(sub, dict) else None


Readers = tuple[tuple[str, tuple[str, ...], bool], ...]
"""The CEL rules above a value: (rule, the field names from the rule's object down to the
value, whether a list or a map lies between them)."""


def _read_by_rule(readers: Readers) -> bool:
    """Whether a validation rule above a value reads it: CEL takes no ``2.0`` for an int, so
    the API server refuses a whole number written with a fraction in a field a rule reads
    ("invalid data, expected int, got float64 evaluating rule") and takes it elsewhere.
    Through a list or a map a rule reaches it by a variable, so any mention counts."""
    for rule, fields, collection in readers:
        if collection:
            if fields and re.search(rf"\b{re.escape(fields[-1])}\b", rule):
                return True
        elif re.search(rf"\bself{re.escape(''.join('.' + f for f in fields))}(?![\w])", rule):
            return True
    return False


_GUARD: Final = re.compile(r"^!has\(self((?:\.\w+)+)\)\s*\|\|")
"""A rule that begins ``!has(self.a.b) ||`` is true, and reads nothing more, without a.b."""


def _evaluated(rule: str, value: Any) -> bool:
    """Whether ``rule`` reads past its leading ``!has(...)`` guard on ``value``."""
    guard = _GUARD.match(rule)
    if guard is None:
        return True
    node = value
    for name in guard.group(1).split(".")[1:]:
        if not isinstance(node, dict) or node.get(name) is None:
            return False
        node = node[name]
    return True


def as_created(
    value: Any, schema: dict[str, Any], path: str, nulls: list[str], readers: Readers = ()
) -> Any:
    """``value`` as the API server reads it on a create (pure): a null where the schema
    declares a field that is not nullable is dropped (apiextensions' prunenulls.go: left
    out, or defaulted where the CRD has a default, as pydantic's defaults do here), and its
    path added to ``nulls`` where there is no default (a server-side apply refuses those);
    a whole number written with a fraction (``2.0``) where the schema asks for an integer
    is that integer (Go's JSON decoding, then the OpenAPI type check, take it) unless a
    validation rule reads it (:func:`_read_by_rule`). A null list item
    stays: the API server refuses it, and so does validation."""
    rules = (str(r.get("rule", "")) for r in schema.get("x-kubernetes-validations", ()))
    readers = (*readers, *((rule, (), False) for rule in rules if _evaluated(rule, value)))
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            sub = _field_schema(schema, key)
            if item is None and sub is not None and not sub.get("nullable"):
                if "default" not in sub:  # a server-side apply defaults it too
                    nulls.append(f"{path}.{key}")
                continue
            declared = key in (schema.get("properties") or {})
            below = tuple((r, (*f, key), c or not declared) for r, f, c in readers)
            result[key] = as_created(item, sub or {}, f"{path}.{key}", nulls, below)
        return result
    if isinstance(value, list):
        items = schema.get("items") or {}
        below = tuple((r, f, True) for r, f, _ in readers)
        return [
            as_created(item, items, f"{path}[{i}]", nulls, below) for i, item in enumerate(value)
        ]
    if (
        schema.get("type") == "integer"
        and isinstance(value, float)
        and value.is_integer()
        and not _read_by_rule(readers)
    ):
        return int(value)
    return value


def unknown_fields(value: Any, schema: dict[str, Any] | None, path: str) -> list[str]:
    """Paths of the fields in ``value`` that ``schema`` does not declare, as strict field
    validation finds them (pure; apiextensions' pruning.go): a mapping where the schema has
    no fields (a scalar's or a list's place, or a list's items where it has none) has every
    key undeclared. Values of the wrong type are not its concern otherwise: strict decoding
    looks only for undeclared fields."""
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            sub = None if schema is None else _field_schema(schema, key)
            if sub is None:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, sub, f"{path}.{key}")
    elif isinstance(value, list):
        items = None if schema is None else schema.get("items")
        for index, item in enumerate(value):
            found += unknown_fields(item, items, f"{path}[{index}]")
    return found


MAX_MANIFEST_DEPTH: Final = 64
"""Deepest nesting a manifest may have: a pod's affinity, the deepest real field, needs ~12;
far deeper ones would exhaust the stack of whatever walks them (rendering, serializing)."""


def _too_deep(manifest: object) -> str | None:
    """The path (abbreviated) of the first value nested past MAX_MANIFEST_DEPTH, or None."""
    path = path_deeper_than(manifest, MAX_MANIFEST_DEPTH)
    if path is None:
        return None
    return ".".join(path[:6]).replace(".[", "[") + f"... ({len(path)} levels)"


METADATA_NAME_RULE_MESSAGE: Final = (
    "must be a DNS-1035 label of at most 63 characters (lowercase letters, digits and '-', "
    "starting with a letter): it names Services"
)
METADATA_NAME_CEL: Final = (
    f"self.metadata.name.size() <= {NAME_MAX_LENGTH} && "
    f"self.metadata.name.matches('{NAME_PATTERN}')"
)
