"""The engine launcher: RDMA preflight, pod-only settings, then exec of vLLM or SGLang."""
