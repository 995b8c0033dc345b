"""The engine pod's own tools, in a distribution of their own (``disagg-engine``) with nothing
but the standard library, so installing it into a vLLM or SGLang image changes none of the
engine's packages: the launcher (RDMA preflight, pod-only settings, then exec of the engine)
and the preStop drain."""
