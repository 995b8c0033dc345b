"""The DisaggregatedModel API (disagg.dev/v1alpha1): pydantic models, rules, CRD generation."""

from disagg.api.metadata import Metadata
from disagg.api.resource import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    DisaggregatedModel,
    ManifestError,
    parse_manifest,
    parse_model,
)
from disagg.api.spec import DisaggregatedModelSpec, PoolSpec, Role
from disagg.api.status import Condition, DisaggregatedModelStatus, PoolStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Condition",
    "DisaggregatedModel",
    "DisaggregatedModelSpec",
    "DisaggregatedModelStatus",
    "ManifestError",
    "Metadata",
    "PoolSpec",
    "PoolStatus",
    "Role",
    "parse_manifest",
    "parse_model",
]
