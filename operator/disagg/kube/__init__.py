"""Kubernetes I/O: the only place the operator talks to the API server."""
