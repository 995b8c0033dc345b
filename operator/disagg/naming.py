"""Every child name, label, selector and annotation key the operator uses.

Names are ``<model>-prefill``, ``<model>-decode`` (or, colocated, ``<model>-engine``) and
``<model>-router``: DNS-1123 labels of
at most 63 characters, truncated with a short stable hash when the model name is long.
Selectors are built from two labels only and never change after creation (a Deployment's
selector is immutable).
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

ComponentRole = Literal["prefill", "decode", "engine", "router"]

MANAGER: Final = "disagg-operator"
"""Field manager of every server-side apply and value of app.kubernetes.io/managed-by."""
PART_OF: Final = "disagg"

MODEL_LABEL: Final = "disagg.dev/model"
ROLE_LABEL: Final = "disagg.dev/role"
SPEC_HASH_ANNOTATION: Final = "disagg.dev/spec-hash"
RELEARN_ANNOTATION: Final = "disagg.dev/autoscaler-relearn"
"""On a DisaggregatedModel: any change of its value (set, changed, removed) makes the
autoscaler learn its pools' speeds again, for changes the spec does not show (a moved image
tag, new hardware behind the same node selector, a driver upgrade)."""
MULTUS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"
SGLANG_BOOTSTRAP_ANNOTATION: Final = "sglang.ai/bootstrap-port"

MAX_NAME_LENGTH: Final = 63
_FORBIDDEN_SERVICE_NAMES: Final = frozenset({"vllm"})


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def fit_name(base: str, suffix: str) -> str:
    """``<base>-<suffix>`` cut to 63 characters; a truncated base gets a stable hash."""
    full = f"{base}-{suffix}"
    if len(full) <= MAX_NAME_LENGTH:
        return full
    digest = _short_hash(base)
    room = MAX_NAME_LENGTH - len(suffix) - len(digest) - 2
    return f"{base[:room].rstrip('-')}-{digest}-{suffix}"


def child_name(model: str, role: ComponentRole) -> str:
    """Name of the Deployment (and Service, PDB) of one component of a model."""
    name = fit_name(model, role)
    if name in _FORBIDDEN_SERVICE_NAMES:
        # A Service named vllm injects VLLM_PORT=tcp://... into pods, which vLLM rejects.
        name = fit_name(model, f"{role}-svc")
    return name


def router_service_account(model: str) -> str:
    """ServiceAccount (and Role, RoleBinding) the router uses to watch the pools' pods."""
    return fit_name(model, "router")


def selector_labels(model: str, role: ComponentRole) -> dict[str, str]:
    """The immutable selector of one component's Deployment, Service and PDB."""
    return {MODEL_LABEL: model, ROLE_LABEL: role}


def labels(model: str, role: ComponentRole) -> dict[str, str]:
    """All labels of one component's objects and pods.

    No version label: it would sit in pod templates, and an operator upgrade would then
    restart every GPU pod.
    """
    return {
        "app.kubernetes.io/name": "disagg-router" if role == "router" else "disagg-engine",
        "app.kubernetes.io/instance": model,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": PART_OF,
        **selector_labels(model, role),
    }


CHILDREN_SELECTOR: Final = f"app.kubernetes.io/managed-by={MANAGER},{MODEL_LABEL}"
"""Label selector matching every child (and pod) of every model the operator manages."""


def model_selector(model: str) -> str:
    """Label selector matching every child of a model."""
    return f"{MODEL_LABEL}={model}"


def pool_selector(model: str, role: ComponentRole) -> str:
    """Label selector string of one component's pods (for kubectl and the router)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(model, role).items())
