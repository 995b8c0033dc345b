"""Model and GPU profiles of the latency model (published architecture and datasheet figures).

Sources are in ``shared/reference/performance.md``: model shapes from the Hugging Face
``config.json`` values, GPU peaks from NVIDIA datasheets, efficiencies (MFU per phase, MBU by
tensor-parallel degree) from the BLIS calibration, Vidur profiles and AIConfigurator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ModelProfile:
    """What the latency model needs to know about a transformer."""

    name: str
    active_params: float
    """Parameters touched per token (all of them, or the active experts of an MoE)."""
    total_params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2
    mla_latent_dim: int | None = None
    """kv_lora_rank + qk_rope_head_dim of an MLA model (its KV is one latent per layer)."""
    aliases: tuple[str, ...] = ()
    max_context: int = 131_072
    """The longest prompt plus output the model serves (``max_position_embeddings``, with the
    rope scaling its card documents): vLLM refuses a request over it with a 400."""

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.bytes_per_param

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV-cache bytes one token occupies across the whole model (all TP shards)."""
        if self.mla_latent_dim is not None:
            return self.layers * self.mla_latent_dim * bytes_per_element
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_element

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim


@dataclass(frozen=True)
class GpuProfile:
    """Peak figures and calibrated efficiencies of one GPU type."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    hbm_bytes: float
    nvlink_bandwidth: float
    """Per direction, bytes/s."""
    mfu_prefill: float
    mfu_decode: float
    mbu_by_tp: tuple[tuple[int, float], ...]
    """(largest TP degree, memory-bandwidth utilisation) steps."""

    def mbu(self, tp: int) -> float:
        for limit, value in self.mbu_by_tp:
            if tp <= limit:
                return value
        return self.mbu_by_tp[-1][1]


MODELS: Final[dict[str, ModelProfile]] = {
    m.name: m
    for m in (
        ModelProfile(
            "opt-13b", 12.9e9, 12.9e9, 40, 5120, 40, 40, 128, aliases=("facebook/opt-13b",),
            max_context=2048,
        ),
        ModelProfile(
            "llama-3.1-8b", 8.03e9, 8.03e9, 32, 4096, 32, 8, 128,
            aliases=("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
        ),
        ModelProfile(
            "llama-3.1-70b", 70.6e9, 70.6e9, 80, 8192, 64, 8, 128,
            aliases=("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct"),
        ),
        ModelProfile(
            "qwen2.5-32b", 32.5e9, 32.5e9, 64, 5120, 40, 8, 128,
            aliases=("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct"),
        ),
        ModelProfile(
            "deepseek-v3", 37e9, 671e9, 61, 7168, 128, 128, 128, bytes_per_param=1,
            mla_latent_dim=576, aliases=("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1"),
            max_context=163_840,
        ),
    )
}  # fmt: skip

_A100_MBU: Final = ((2, 0.75), (4, 0.67), (8, 0.6))
_HOPPER_MBU: Final = ((2, 0.8), (4, 0.7), (8, 0.6))

GPUS: Final[dict[str, GpuProfile]] = {
    g.name: g
    for g in (
        GpuProfile("a100", 312e12, 2.039e12, 80e9, 300e9, 0.38, 0.18, _A100_MBU),
        GpuProfile("h100", 989e12, 3.35e12, 80e9, 450e9, 0.45, 0.30, _HOPPER_MBU),
        GpuProfile("h200", 989e12, 4.8e12, 141e9, 450e9, 0.45, 0.30, _HOPPER_MBU),
    )
}


def model_profile(name: str) -> ModelProfile:
    """A model profile by short name or Hugging Face id (case-insensitive)."""
    wanted = name.lower()
    for profile in MODELS.values():
        if wanted == profile.name or wanted in (a.lower() for a in profile.aliases):
            return profile
    known = ", ".join(sorted(MODELS))
    raise KeyError(f"unknown model profile {name!r}; known: {known}")


def gpu_profile(name: str) -> GpuProfile:
    """A GPU profile by name (a100, h100, h200)."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise KeyError(f"unknown GPU profile {name!r}; known: {', '.join(sorted(GPUS))}") from None
