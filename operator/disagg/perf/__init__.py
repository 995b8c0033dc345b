"""The latency model shared by the engine simulator and the fleet simulator (pure)."""

from disagg.perf.profiles import GPUS, MODELS, GpuProfile, ModelProfile, gpu_profile, model_profile
from disagg.perf.roofline import (
    NETWORKS,
    EngineShape,
    NetworkProfile,
    PrefillChunk,
    kv_capacity_tokens,
    step_time,
    transfer_time,
)

__all__ = [
    "GPUS",
    "MODELS",
    "NETWORKS",
    "EngineShape",
    "GpuProfile",
    "ModelProfile",
    "NetworkProfile",
    "PrefillChunk",
    "gpu_profile",
    "kv_capacity_tokens",
    "model_profile",
    "step_time",
    "transfer_time",
]
