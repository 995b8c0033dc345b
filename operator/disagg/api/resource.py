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
from disagg.api.scheduling import DNS_LABEL, SCHEDULING_PATTERN_MEANINGS
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


class Metadata(BaseModel):
    """The parts of ObjectMeta the operator reads; everything else passes through."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    name: str
    namespace: str = Field(default="default", max_length=63, pattern=DNS_LABEL)
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


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


PATTERN_MEANINGS = {**SCHEDULING_PATTERN_MEANINGS, **CONTAINER_PATTERN_MEANINGS}
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


def parse_model(manifest: object) -> DisaggregatedModel:
    """Validate a manifest (a parsed YAML/JSON document), without its status, into a
    :class:`DisaggregatedModel`."""
    if not isinstance(manifest, dict):
        raise ManifestError([f"<root>: expected a mapping, got {type(manifest).__name__}"])
    # Status is left out, as the API server leaves it out of a create (the CRD has a status
    # subresource: apiextensions' PrepareForCreate deletes it before validating) and keeps
    # it out of an update. It is the operator's to write, perhaps by another version (a
    # rollback finds fields there it does not know), and it is read on its own
    # (disagg.status.previous_status, disagg.autoscale.recall.recalled): validated with the
    # spec, it made a model InvalidSpec, and stopped reconciling it, for nothing the user
    # wrote.
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
        schema = api_schema(DisaggregatedModelSpec)
        spec = without_defaulted_nulls(manifest["spec"], schema, "spec", nulls)
        if nulls:
            raise ManifestError(
                [f"{path}: null is not allowed; leave the field out" for path in nulls]
            )
        manifest = {**manifest, "spec": spec}
    try:
        return DisaggregatedModel.model_validate(manifest)
    except ValidationError as error:
        raise ManifestError(format_validation_error(error)) from error


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


def without_defaulted_nulls(value: Any, schema: dict[str, Any], path: str, nulls: list[str]) -> Any:
    """``value`` read as the API server reads it: a null where the CRD gives the field a
    default is dropped (the server prunes it, then defaults the field); any other null is
    added to ``nulls`` (the server refuses it: no field here is nullable) (pure)."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        result = {}
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if item is None and sub is not None:
                if "default" not in sub:
                    nulls.append(f"{path}.{key}")
                continue
            result[key] = without_defaulted_nulls(item, sub or {}, f"{path}.{key}", nulls)
        return result
    if isinstance(value, list):
        items = schema.get("items") or {}
        return [
            without_defaulted_nulls(item, items, f"{path}[{i}]", nulls)
            for i, item in enumerate(value)
        ]
    return value


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
