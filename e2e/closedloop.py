"""The closed loop lives in the package (disagg.demo.stack) so that `disagg demo` uses it too."""

from disagg.demo.stack import (
    TIME_SCALE,
    LoadReport,
    ReplicaRecorder,
    Stack,
    drive,
    model_manifest,
    stack,
)

__all__ = [
    "TIME_SCALE",
    "LoadReport",
    "ReplicaRecorder",
    "Stack",
    "drive",
    "model_manifest",
    "stack",
]
