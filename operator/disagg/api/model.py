"""``spec.model``: the model both pools serve, and where its weights come from."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field

from disagg.api.base import ApiModel
from disagg.api.rules import Rule


class SecretKeyRef(ApiModel):
    """A key of a Secret in the model's namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(default="token", min_length=1, description="Key inside the Secret.")


class HuggingFaceSource(ApiModel):
    """Download the model from the Hugging Face Hub when the engine starts."""

    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding a Hugging Face access token (exported as HF_TOKEN); "
        "needed for gated models such as Llama.",
    )
    revision: str | None = Field(default=None, description="Branch, tag or commit to load.")


class PvcSource(ApiModel):
    """Load the model from a PersistentVolumeClaim mounted read-only at /models."""

    claim_name: str = Field(min_length=1, description="Name of the PersistentVolumeClaim.")


class ModelSource(ApiModel):
    """Where the weights come from. Defaults to the Hugging Face Hub without a token."""

    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download from the Hugging Face Hub."
    )
    pvc: PvcSource | None = Field(
        default=None,
        description="Read from a PVC; spec.model.name is then the path inside the volume.",
    )

    rules: ClassVar = (
        Rule(
            cel="!(has(self.huggingFace) && has(self.pvc))",
            message="model.source: choose one of huggingFace or pvc",
            check=lambda m: not (m.hugging_face is not None and m.pvc is not None),
        ),
    )


class ModelSpec(ApiModel):
    """The model to serve. Both pools load exactly the same model string."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description="Hugging Face model id (e.g. meta-llama/Llama-3.1-8B-Instruct) or, with a "
        "pvc source, the model's directory inside the volume.",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        description="Name clients put in the request's `model` field and the `model_name` "
        "metric label. Default: spec.model.name.",
    )
    source: ModelSource = Field(
        default_factory=ModelSource, description="Where the weights come from."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        le=2**31 - 1,
        description="Maximum context length in tokens. Default: the model's.",
    )
    mla: bool = Field(
        default=False,
        description="The model uses multi-head latent attention (DeepSeek-V2/V3): its KV "
        "cache is replicated across tensor-parallel ranks (smaller per token). Different "
        "prefill and decode TP degrees are only partly supported upstream for MLA models.",
    )

    rules: ClassVar = (
        Rule(
            # Both become command-line values of the engines and the router: a leading '-'
            # reads as an option there, and whitespace splits the name.
            cel="self.name.matches('^[^-\\\\s][^\\\\s]*$') && (!has(self.servedName) || "
            "self.servedName.matches('^[^-\\\\s][^\\\\s]*$'))",
            message="model.name and model.servedName must not start with '-' or contain "
            "whitespace: the engines and the router take them as command-line values",
            check=lambda m: all(
                re.fullmatch(r"[^-\s][^\s]*", name) is not None
                for name in (m.name, m.served_name)
                if name is not None
            ),
        ),
    )
