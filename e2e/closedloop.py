"""The closed loop lives in the package (disagg.demo.stack, with its load generator in
disagg.demo.load) so that `disagg demo` uses it too."""

from disagg.demo.load import LoadReport, drive
from disagg.demo.stack import TIME_SCALE, ReplicaRecorder, Stack, model_manifest, stack

__all__ = [
    "TIME_SCALE",
    "LoadReport",
    "ReplicaRecorder",
    "Stack",
    "drive",
    "model_manifest",
    "stack",
]
