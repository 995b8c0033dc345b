"""What the local control plane needs before its first process starts: the Kubernetes,
etcd and kwok binaries (found in the machine's cache, or built from a source checkout), the
certificates, the admin token and the kubeconfig every component, test and user shares."""

from __future__ import annotations

import base64
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from disagg.devcluster.layout import Layout, Ports, cache_dir


class ClusterError(RuntimeError):
    """A failure to report to the user: it names the component and the log to read."""


@dataclass(frozen=True)
class Binaries:
    """Paths of every program the control plane runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path


def repo_root() -> Path | None:
    """The source checkout this package runs from, if any (it holds the build script)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "e2e" / "cluster" / "build-binaries.sh").exists() else None


def find_binaries() -> Binaries | None:
    """The cached builds (etcd, Kubernetes, kwok), or None when any is missing."""
    k8s = cache_dir() / "bin" / "k8s"
    kwok = cache_dir() / "bin" / "kwok" / "kwok"
    etcd = cache_dir() / "bin" / "etcd" / "etcd"
    paths = [
        k8s / n for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    ]
    if not etcd.exists() or not kwok.exists() or not all(p.exists() for p in paths):
        return None
    apiserver, controller_manager, scheduler, kubectl_path = paths
    return Binaries(etcd, apiserver, controller_manager, scheduler, kubectl_path, kwok)


def ensure_binaries(say: Callable[[str], None]) -> Binaries:
    """Find the binaries, building them first (with visible progress) when a checkout can."""
    found = find_binaries()
    if found is not None:
        return found
    root = repo_root()
    if root is None:
        raise ClusterError(
            f"the Kubernetes binaries are not built in {cache_dir() / 'bin'} and no source "
            "checkout is available to build them: run `make binaries` in the repository"
        )
    if shutil.which("go") is None:
        raise ClusterError(
            "the Go toolchain is missing: it is needed to build the Kubernetes binaries"
        )
    say("building etcd, Kubernetes and kwok from the Go module proxy (first time: many minutes)")
    result = subprocess.run(
        ["bash", str(root / "e2e" / "cluster" / "build-binaries.sh")], check=False
    )
    found = find_binaries()
    if result.returncode != 0 or found is None:
        raise ClusterError(f"building the binaries failed; see the logs in {cache_dir() / 'logs'}")
    return found


def _openssl(command: str, *, cwd: Path) -> None:
    """Run ``openssl`` with the words of ``command`` (none holds a space)."""
    args = command.split()
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def ensure_pki(layout: Layout) -> str:
    """CA, API server serving certificate, service-account key and admin token; returns it."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl("req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt "
                 "-subj /CN=disagg-dev-ca", cwd=pki)  # fmt: skip
    if not (pki / "apiserver.crt").exists():
        (pki / "san.cnf").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        )
        _openssl("req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr "
                 "-subj /CN=kube-apiserver", cwd=pki)  # fmt: skip
        _openssl("x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
                 "-days 3650 -out apiserver.crt -extfile san.cnf", cwd=pki)  # fmt: skip
    if not (pki / "sa.key").exists():
        _openssl("genrsa -out sa.key 2048", cwd=pki)
    if not layout.tokens.exists():
        token = secrets.token_hex(24)
        layout.tokens.write_text(f'{token},admin,admin-uid,"system:masters"\n')
        layout.tokens.chmod(0o600)
    return layout.tokens.read_text().split(",", 1)[0]


def write_kubeconfig(layout: Layout, ports: Ports, token: str) -> None:
    """The admin kubeconfig every component, test and user shares."""
    ca = base64.b64encode((layout.pki / "ca.crt").read_bytes()).decode()
    layout.kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: disagg-dev\n  cluster:\n"
        f"    server: https://127.0.0.1:{ports.apiserver}\n"
        f"    certificate-authority-data: {ca}\n"
        "users:\n- name: admin\n  user:\n"
        f"    token: {token}\n"
        "contexts:\n- name: disagg-dev\n  context:\n    cluster: disagg-dev\n    user: admin\n"
        "current-context: disagg-dev\n"
    )
    layout.kubeconfig.chmod(0o600)
