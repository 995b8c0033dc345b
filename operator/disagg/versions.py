"""Every pinned version and default image in one place.

The chart, the Dockerfiles and the renderer all read these; a test checks that they agree.
"""

import argparse
import re
from dataclasses import dataclass
from typing import Final

VERSION: Final = "0.1.0"
VLLM_VERSION: Final = "0.33.0"
SGLANG_VERSION: Final = "0.5.23"
IMAGE_REPOSITORY: Final = "ghcr.io/disagg-dev"


@dataclass(frozen=True)
class DataPlaneImages:
    """The images a model's pods run unless its spec names others: the bundled engines and
    the router, from one registry at one release (``disagg run --image-registry`` and
    ``--image-tag``; the chart's ``dataPlane.imageRegistry`` and ``imageTag``), so an
    air-gapped cluster mirrors them once instead of overriding every model."""

    registry: str = IMAGE_REPOSITORY
    tag: str = VERSION

    @property
    def vllm(self) -> str:
        return f"{self.registry}/engine:{self.tag}-vllm{VLLM_VERSION}"

    @property
    def sglang(self) -> str:
        return f"{self.registry}/engine:{self.tag}-sglang{SGLANG_VERSION}"

    @property
    def router(self) -> str:
        return f"{self.registry}/router:{self.tag}"


LLM_D_VERSION: Final = "v0.4.0"
"""llm-d-inference-scheduler, whose endpoint picker and routing sidecar serve a model with
router.kind inferencePool (its release builds on the Inference Extension v1.2.0)."""
LLM_D_EPP_IMAGE: Final = f"ghcr.io/llm-d/llm-d-inference-scheduler:{LLM_D_VERSION}"
LLM_D_SIDECAR_IMAGE: Final = f"ghcr.io/llm-d/llm-d-routing-sidecar:{LLM_D_VERSION}"

DEFAULT_IMAGES: Final = DataPlaneImages()
DEFAULT_OPERATOR_IMAGE: Final = f"{IMAGE_REPOSITORY}/operator:{VERSION}"


_REGISTRY: Final = re.compile(
    r"^[a-z0-9]+([.-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
)
_TAG: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def registry_problem(registry: str) -> str | None:
    """What is wrong with an image registry and path (``host[:port]/path``), or None."""
    if _REGISTRY.fullmatch(registry):
        return None
    return "must be host[:port] and an optional path, lowercase, e.g. registry.local:5000/disagg"


def tag_problem(tag: str) -> str | None:
    """What is wrong with an image tag, or None."""
    if _TAG.fullmatch(tag):
        return None
    return "must be an image tag: letters, digits, '_', '.' and '-', at most 128"


def add_image_flags(parser: argparse.ArgumentParser) -> None:
    """``--image-registry`` and ``--image-tag``: the :class:`DataPlaneImages` in force."""
    parser.add_argument(
        "--image-registry",
        default=IMAGE_REPOSITORY,
        help="where the bundled engine and router images come from when a model names none "
        "(a mirror, for air-gapped clusters; default: %(default)s)",
    )
    parser.add_argument(
        "--image-tag",
        default=VERSION,
        help="their release tag (engine images add -vllm<version> or -sglang<version>; "
        "default: %(default)s)",
    )


def images_from_args(args: argparse.Namespace) -> DataPlaneImages:
    """The images the flags of :func:`add_image_flags` name, or ValueError saying which
    flag is wrong and why."""
    for flag, value, problem in (
        ("--image-registry", args.image_registry, registry_problem(args.image_registry)),
        ("--image-tag", args.image_tag, tag_problem(args.image_tag)),
    ):
        if problem:
            raise ValueError(f"{flag} {value!r}: {problem}")
    return DataPlaneImages(args.image_registry, args.image_tag)
