"""The operator's Prometheus client, and `disagg diagnose`, against Debian's Prometheus behind
TLS with a self-signed CA, asking for a client certificate and basic auth: the server's
certificate is verified (refused without its CA), the client certificate and the credentials
are sent (refused without them or with a wrong password), and each failure reads as what the
user sets to fix it, without the secret."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from dataplane import LOG_DIR
from diagnosis import Prometheus
from disagg.demo.procs import wait_for
from disagg.devcluster.layout import free_port
from disagg.prometheus_access import PrometheusAccess
from disagg.reconcile.prometheus import MetricsUnavailable, PrometheusSource
from disagg.yamlio import dump

PASSWORD = "e2e-only-password"
PASSWORD_BCRYPT = "$2b$10$uDgINtikw6tYf/8in0FpPeyoHbL7SZ7J6vw0OA0eAViaNI8OXPaPa"
"""bcrypt (10 rounds) of PASSWORD, as Prometheus' web config takes it (made once with
Python's bcrypt: the test needs the hash, not the library)."""


@dataclass(frozen=True)
class Secured:
    url: str
    access: PrometheusAccess
    """Everything it asks for: its CA, a client certificate, the user and password."""
    dir: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(root: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=disagg e2e CA", cwd=root)  # fmt: skip
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (root / f"{name}.ext").write_text(extension + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN=disagg e2e {name}", cwd=root)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
                 f"{name}.ext", cwd=root)  # fmt: skip


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed: run `make system-packages`"
    root = tmp_path_factory.mktemp("prometheus-tls")
    _certificates(root)
    (root / "web.yml").write_text(
        dump(
            {
                "tls_server_config": {
                    "cert_file": str(root / "server.crt"),
                    "key_file": str(root / "server.key"),
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": str(root / "ca.crt"),
                },
                "basic_auth_users": {"operator": PASSWORD_BCRYPT},
            }
        )
    )
    (root / "prometheus.yml").write_text(dump({"global": {"scrape_interval": "15s"}}))
    (root / "password").write_text(PASSWORD + "\n")  # as a Secret mounts it, newline and all
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / "prometheus-tls.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary, f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}", f"--web.config.file={root / 'web.yml'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            ],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    access = PrometheusAccess(
        ca_file=str(root / "ca.crt"), cert_file=str(root / "client.crt"),
        key_file=str(root / "client.key"), username="operator",
        password_file=str(root / "password"),
    )  # fmt: skip

    context = ssl.create_default_context(cafile=str(root / "ca.crt"))
    context.load_cert_chain(str(root / "client.crt"), str(root / "client.key"))

    def ready() -> bool:
        try:
            answer = httpx.get(
                f"{url}/-/ready", verify=context, auth=("operator", PASSWORD), timeout=2
            )
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    try:
        wait_for("Prometheus to serve over TLS", ready, timeout=30)
        yield Secured(url, access, root)
    finally:
        Prometheus(url, process).stop()


def _query(url: str, access: PrometheusAccess) -> float | None:
    return asyncio.run(PrometheusSource(url, access).query("vector(42)"))[0]


def test_with_its_ca_a_client_certificate_and_the_password_the_query_is_answered(
    secured: Secured,
) -> None:
    assert _query(secured.url, secured.access) == 42.0


def test_a_certificate_no_trusted_ca_signed_is_refused_and_the_reason_names_the_fix(
    secured: Secured,
) -> None:
    with pytest.raises(MetricsUnavailable) as refused:
        _query(secured.url, replace(secured.access, ca_file=None))
    message = str(refused.value)
    assert "is not signed by a CA this host trusts" in message, message
    assert "--prometheus-ca-file" in message and "prometheus.tls.ca" in message
    # Skipping the check is explicit, and then the same server answers.
    skipping = replace(secured.access, ca_file=None, insecure_skip_verify=True)
    assert _query(secured.url, skipping) == 42.0


def test_without_a_client_certificate_the_handshake_fails_saying_one_is_asked_for(
    secured: Secured,
) -> None:
    with pytest.raises(MetricsUnavailable) as refused:
        _query(secured.url, replace(secured.access, cert_file=None, key_file=None))
    assert "asks for a client certificate and none was given" in str(refused.value)


def test_missing_or_wrong_credentials_read_as_refused_credentials_never_showing_them(
    secured: Secured,
) -> None:
    with pytest.raises(MetricsUnavailable) as refused:
        _query(secured.url, replace(secured.access, username=None, password_file=None))
    assert "refused the credentials (HTTP 401)" in str(refused.value)
    wrong = secured.dir / "wrong-password"
    wrong.write_text("not-the-password")
    with pytest.raises(MetricsUnavailable) as refused:
        _query(secured.url, replace(secured.access, password_file=str(wrong)))
    assert "HTTP 401" in str(refused.value) and "not-the-password" not in str(refused.value)


def test_diagnose_reaches_it_with_the_same_flags(secured: Secured) -> None:
    flags = [
        "--prometheus-cert-file", str(secured.dir / "client.crt"),
        "--prometheus-key-file", str(secured.dir / "client.key"),
        "--prometheus-username", "operator",
        "--prometheus-password-file", str(secured.dir / "password"),
    ]  # fmt: skip
    command = [
        sys.executable, "-m", "disagg.cli", "diagnose", "--prometheus", secured.url,
        "--model", "nothing-here", "--since", "5m", "-o", "json",
    ]  # fmt: skip
    trusted = [*command, *flags, "--prometheus-ca-file", str(secured.dir / "ca.crt")]
    answered = subprocess.run(trusted, capture_output=True, text=True, timeout=60)
    assert answered.returncode == 0, answered.stderr
    assert '"prometheus": "https://127.0.0.1' in answered.stdout
    untrusted = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=60)
    assert untrusted.returncode == 1
    assert "is not signed by a CA this host trusts" in untrusted.stderr, untrusted.stderr
