"""disagg-operator: prefill/decode disaggregated LLM serving on Kubernetes."""

from disagg.versions import VERSION as __version__

__all__ = ["__version__"]
