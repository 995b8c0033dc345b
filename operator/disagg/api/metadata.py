"""A DisaggregatedModel's metadata, judged as the API server judges any object's.

The API server decodes ``metadata`` into ObjectMeta (strictly: an unknown field is refused)
and validates it (Kubernetes v1.35.4, ``staging/src/k8s.io/apimachinery/pkg/api/validation``
``ValidateObjectMetaAccessor``): label keys are qualified names and their values label
values, annotation keys are qualified names once lowercased and all annotations together
are at most 256 KiB, finalizers are qualified names. A null label or annotation value
decodes to the empty string, and a null map to none. The operator reads ``name``,
``namespace``, ``uid``, ``generation``, ``labels`` and ``annotations``; the rest passes
through.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from disagg.api.scheduling import DNS_LABEL, LABEL_VALUE, label_key_ok

OBJECT_META_FIELDS: Final = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
        "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
        "labels", "annotations", "ownerReferences", "finalizers", "managedFields",
    }
)  # fmt: skip
ANNOTATIONS_MAX_BYTES: Final = 256 * 1024
"""TotalAnnotationSizeLimitB: every key and value together."""
_QUALIFIED: Final = (
    "must be a qualified name: an optional DNS subdomain prefix and '/', then at most 63 "
    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
)


def _strings(value: Any) -> Any:
    """A map as ObjectMeta decodes it: null is no map, a null value the empty string."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {key: "" if item is None else item for key, item in value.items()}
    return value


class Metadata(BaseModel):
    """The parts of ObjectMeta the operator reads; everything else passes through."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    name: str
    namespace: str = Field(default="default", max_length=63, pattern=DNS_LABEL)
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in data if key not in OBJECT_META_FIELDS)
            if unknown:
                raise ValueError(
                    f"unknown field(s) {', '.join(unknown)}: not part of an object's metadata"
                )
        return data

    @field_validator("labels", "annotations", mode="before")
    @classmethod
    def _null_values_are_empty(cls, value: Any) -> Any:
        return _strings(value)

    @field_validator("labels")
    @classmethod
    def _labels_are_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not label_key_ok(key):
                raise ValueError(f"label key {key!r} {_QUALIFIED}")
            if len(value) > 63 or not re.fullmatch(LABEL_VALUE, value):
                raise ValueError(
                    f"label {key!r}: value {value[:80]!r} must be at most 63 letters, digits, "
                    "'-', '_' or '.', starting and ending with a letter or digit (or empty)"
                )
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotations_fit(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key in annotations:
            if not label_key_ok(key.lower()):
                raise ValueError(f"annotation key {key!r} {_QUALIFIED}")
        size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
        if size > ANNOTATIONS_MAX_BYTES:
            raise ValueError(f"annotations total {size} bytes; at most {ANNOTATIONS_MAX_BYTES}")
        return annotations

    @field_validator("finalizers")
    @classmethod
    def _finalizers_are_qualified(cls, finalizers: list[str] | None) -> list[str] | None:
        for finalizer in finalizers or ():
            if not label_key_ok(finalizer):
                raise ValueError(f"finalizer {finalizer!r} {_QUALIFIED}")
        return finalizers
