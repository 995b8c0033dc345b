"""Simulators: a vLLM-compatible engine process (no GPU) and, later, whole fleets."""
