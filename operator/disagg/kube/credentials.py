"""Where the API server is and how to authenticate to it: a kubeconfig, or the pod's own
service account.

In a pod (the operator's and the router's), the service account's mounted token and CA
certificate are read directly, and the token is re-read as the kubelet rotates it: this needs
no Kubernetes client library, so the router's image carries none. Outside a cluster, a
kubeconfig is read with the official client's loader (the optional ``kubernetes`` package),
which knows every way a kubeconfig can authenticate (client certificates, tokens, exec
plugins such as cloud providers' credential helpers). Both are blocking and run at startup,
off the event loop; any failure is a :class:`CredentialsError` that says what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG: Final = Path("~/.kube/config")


class CredentialsError(Exception):
    """No usable credentials: the message says which source was tried and what failed."""


@dataclass
class Credentials:
    """Where the API server is and how to authenticate to it."""

    host: str
    token: str | None
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool
    refresh: Callable[[], str | None] | None = None
    """Reads the token again (a rotated service account token, an exec plugin's)."""


def load_credentials(
    kubeconfig: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> Credentials:
    """From ``kubeconfig`` if given, else ``$KUBECONFIG`` or ``~/.kube/config`` if either
    exists, else the in-cluster service account."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return _from_kubeconfig(kubeconfig)
    if any(env.get("KUBECONFIG", "").split(os.pathsep)):
        return _from_kubeconfig(env["KUBECONFIG"])  # the loader merges a list, as kubectl does
    default = DEFAULT_KUBECONFIG.expanduser()
    if default.is_file():
        return _from_kubeconfig(str(default))
    return in_cluster(env, service_account)


def in_cluster(env: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account: the API server from the environment the kubelet sets, the
    token and CA certificate from their mounted files."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise CredentialsError(
            "no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and not in a pod "
            "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)"
        )
    token_file, ca_file = service_account / "token", service_account / "ca.crt"

    def read_token() -> str:
        try:
            return token_file.read_text().strip()
        except OSError as error:
            raise CredentialsError(
                f"the service account token {token_file} cannot be read ({error.strerror}): "
                "is automountServiceAccountToken off for this pod?"
            ) from None

    token = read_token()
    if not ca_file.is_file():
        raise CredentialsError(f"the service account CA certificate {ca_file} is missing")
    address = f"[{host}]" if ":" in host else host
    return Credentials(
        host=f"https://{address}:{port}",
        token=token,
        ca_file=str(ca_file),
        cert_file=None,
        key_file=None,
        verify=True,
        refresh=read_token,
    )


def _from_kubeconfig(path: str) -> Credentials:
    try:
        from kubernetes import client, config  # optional: the router's image has no kubeconfig
    except ImportError:
        raise CredentialsError(
            "reading a kubeconfig needs the kubernetes package (pip install kubernetes); "
            "in a pod, leave the kubeconfig unset to use the service account"
        ) from None
    cfg = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=cfg, persist_config=False
        )
    except (config.ConfigException, OSError, TypeError, ValueError) as error:
        raise CredentialsError(f"kubeconfig {path}: {error}") from None

    def token_of(conf: Any) -> str | None:
        value = conf.api_key.get("authorization") or conf.api_key.get("BearerToken")
        if value is None:
            return None
        return str(value).removeprefix("Bearer ").strip()

    def refresh() -> str | None:
        hook = cfg.refresh_api_key_hook
        if hook is not None:
            hook(cfg)
        return token_of(cfg)

    return Credentials(
        host=cfg.host.rstrip("/"),
        token=token_of(cfg),
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
        refresh=refresh if cfg.refresh_api_key_hook is not None else None,
    )
