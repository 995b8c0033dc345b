"""The structural OpenAPI schema of ``spec`` and ``status``, from the pydantic models.

pydantic emits JSON Schema 2020-12; the API server wants a *structural* OpenAPI v3.0 schema:
no ``$ref``, no ``anyOf`` for optionals, ``x-kubernetes-int-or-string`` instead of
``string | integer``, ``x-kubernetes-preserve-unknown-fields`` for free-form Kubernetes
types. :func:`structural` does that translation; :mod:`disagg.api.crd` wraps the result in
the CRD, and :mod:`disagg.api.resource` reads manifests and status against it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from disagg.api.spec import DisaggregatedModelSpec
from disagg.api.status import DisaggregatedModelStatus

Schema = dict[str, Any]

_DROPPED_KEYS = {"title", "$defs"}
_EXCLUSIVE = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**_resolve(target, defs), **{k: v for k, v in node.items() if k != "$ref"}}
        return merged
    return node


def _strip_null(variants: list[Schema]) -> list[Schema]:
    return [v for v in variants if v.get("type") != "null"]


def structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Translate one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    node = _resolve(node, defs)
    out: Schema = {}
    if "anyOf" in node:
        variants = _strip_null(node["anyOf"])
        if node.get("x-kubernetes-int-or-string"):
            out["x-kubernetes-int-or-string"] = True
        elif len(variants) == 1:
            out.update(structural(variants[0], defs))
        else:
            raise ValueError(f"cannot express anyOf {variants} structurally")
    for key, value in node.items():
        if key in _DROPPED_KEYS or key in {"anyOf", "$ref"}:
            continue
        if key == "properties":
            out["properties"] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs)
        elif key == "additionalProperties":
            if value is False:
                continue
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            else:
                out["additionalProperties"] = structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key == "default":
            if value is not None and not isinstance(value, dict | list):
                out["default"] = value
        elif key in _EXCLUSIVE:
            # JSON Schema's exclusive bound is a number; OpenAPI v3.0, which the API server
            # reads, takes the bound as minimum/maximum and a boolean beside it.
            out[_EXCLUSIVE[key]] = value
            out[key] = True
        else:
            out[key] = value
    if out.get("x-kubernetes-int-or-string"):
        # The pattern and length of a quantity apply to its string form (JSON Schema checks
        # them on strings only); the type is what int-or-string replaces.
        for key in ("type", "minLength"):
            out.pop(key, None)
    if out.get("type") == "object" and "properties" in out:
        out.pop("additionalProperties", None)
    return _ordered(out)


_FIRST_KEYS = ("type", "description", "default")


def _ordered(node: Schema) -> Schema:
    """Put type, description and default first so the generated YAML reads well."""
    head = {key: node[key] for key in _FIRST_KEYS if key in node}
    return {**head, **{k: v for k, v in node.items() if k not in head}}


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def add_object_defaults(schema: Schema, model: type[BaseModel]) -> None:
    """Give every always-present nested object its full default value.

    The API server validates a default value with the CEL rules as it stands (nested
    defaults are not applied to it first), so ``default: {}`` would fail rules such as
    ``minReplicas <= maxReplicas``; the complete default object passes. Optional objects
    (default ``None``) stay absent: their presence means something.
    """
    properties = schema.get("properties", {})
    for name, info in model.model_fields.items():
        alias = info.alias or name
        nested = _nested_model(info.annotation)
        if nested is None or alias not in properties:
            continue
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            properties[alias]["default"] = value.model_dump(
                by_alias=True, exclude_none=True, mode="json"
            )
        add_object_defaults(properties[alias], nested)


def model_schema(model: type[DisaggregatedModelSpec] | type[DisaggregatedModelStatus]) -> Schema:
    """The structural schema of ``spec`` or ``status``."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = structural(raw, raw.get("$defs", {}))
    if model is DisaggregatedModelSpec:  # status is written whole by the operator
        add_object_defaults(schema, model)
    reordered: Schema = _reorder_all(schema)
    return reordered


def _reorder_all(node: Any) -> Any:
    if isinstance(node, dict):
        return _ordered({k: _reorder_all(v) if k != "default" else v for k, v in node.items()})
    if isinstance(node, list):
        return [_reorder_all(v) for v in node]
    return node
