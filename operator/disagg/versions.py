"""Every pinned version and default image in one place.

The chart, the Dockerfiles and the renderer all read these; a test checks that they agree.
"""

from typing import Final

VERSION: Final = "0.1.0"
VLLM_VERSION: Final = "0.33.0"
SGLANG_VERSION: Final = "0.5.23"
IMAGE_REPOSITORY: Final = "ghcr.io/disagg-dev"

DEFAULT_VLLM_IMAGE: Final = f"{IMAGE_REPOSITORY}/engine:{VERSION}-vllm{VLLM_VERSION}"
DEFAULT_SGLANG_IMAGE: Final = f"{IMAGE_REPOSITORY}/engine:{VERSION}-sglang{SGLANG_VERSION}"
DEFAULT_ROUTER_IMAGE: Final = f"{IMAGE_REPOSITORY}/router:{VERSION}"
DEFAULT_OPERATOR_IMAGE: Final = f"{IMAGE_REPOSITORY}/operator:{VERSION}"
