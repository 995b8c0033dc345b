"""How the operator and ``disagg diagnose`` reach Prometheus: its default URL, TLS and
credentials, from the same command-line flags (the chart sets them from its values).

TLS is verified by default, against the system's CAs or the bundle given; skipping the check
is an explicit flag. A bearer token or a basic-auth password is read from its file at every
request, so a rotated Secret (or a projected service-account token) is picked up without a
restart; nothing secret is ever put in a log line, a status or an Event.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import requests
import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from disagg.api.autoscaling import DEFAULT_PROMETHEUS_URL as DEFAULT_URL


class AccessError(ValueError):
    """Flags that cannot work together, or a file they name that cannot be read."""


@dataclass(frozen=True)
class PrometheusAccess:
    """Where Prometheus is when a model does not say, and how to talk to it."""

    default_url: str = DEFAULT_URL
    ca_file: str | None = None
    """PEM bundle of the CAs that sign Prometheus' certificate (default: the system's)."""
    insecure_skip_verify: bool = False
    cert_file: str | None = None
    """Client certificate (PEM) for a Prometheus that asks for one (mutual TLS)."""
    key_file: str | None = None
    bearer_token_file: str | None = None
    username: str | None = None
    password_file: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with this configuration, one line per flag (empty when usable)."""
        found = []
        if not self.default_url.startswith(("http://", "https://")):
            found.append(
                f"--prometheus-url: must start with http:// or https://, got {self.default_url!r}"
            )
        if self.bearer_token_file and (self.username or self.password_file):
            found.append(
                "--prometheus-bearer-token-file: give a bearer token or basic auth, not both"
            )
        if bool(self.username) != bool(self.password_file):
            found.append("--prometheus-username and --prometheus-password-file go together")
        if bool(self.cert_file) != bool(self.key_file):
            found.append("--prometheus-cert-file and --prometheus-key-file go together")
        if self.insecure_skip_verify and self.ca_file:
            found.append("--prometheus-ca-file: pointless with --prometheus-insecure-skip-verify")
        files = {
            "--prometheus-ca-file": self.ca_file, "--prometheus-cert-file": self.cert_file,
            "--prometheus-key-file": self.key_file,
            "--prometheus-bearer-token-file": self.bearer_token_file,
            "--prometheus-password-file": self.password_file,
        }  # fmt: skip
        for flag, path in files.items():
            if path and not os.access(path, os.R_OK):
                found.append(f"{flag} {path}: no such file, or not readable")
        return found

    def client(self, url: str, timeout: float) -> PrometheusConnect:
        """A client of the Prometheus at ``url`` (no retries: the caller's loop retries)."""
        session = requests.Session()
        session.verify = False if self.insecure_skip_verify else (self.ca_file or True)
        if self.insecure_skip_verify:
            # Asked for by its flag: a warning at every query would only bury other logs.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        if self.cert_file and self.key_file:
            session.cert = (self.cert_file, self.key_file)
        auth: requests.auth.AuthBase | None = None
        if self.bearer_token_file:
            auth = BearerFromFile(self.bearer_token_file)
        elif self.username and self.password_file:
            auth = BasicFromFile(self.username, self.password_file)
        return PrometheusConnect(
            url=url, session=session, auth=auth, timeout=int(timeout), retry=Retry(total=0)
        )

    def failure(self, url: str, promql: str, error: Exception) -> str:
        """What a failed query says to the user, the same words at every failure (it lands
        in status, which must not churn: no object addresses): a TLS handshake, a
        connection, credentials refused, or a query Prometheus rejected."""
        if isinstance(error, requests.exceptions.SSLError):
            return f"TLS with Prometheus at {url} failed: {self.hint(error)}"
        if isinstance(error, requests.exceptions.RequestException):
            return f"cannot reach Prometheus at {url} ({type(error).__name__})"
        status = str(error).removeprefix("HTTP Status Code ").split(" ", 1)[0]
        if isinstance(error, PrometheusApiClientException) and status in ("401", "403"):
            return (
                f"Prometheus at {url} refused the credentials (HTTP {status}): check "
                "the bearer token or basic auth the operator is given"
            )
        return f"Prometheus at {url} rejected {promql!r}: {error}"

    def hint(self, error: Exception) -> str:
        """What went wrong in a TLS handshake that failed, and what to set."""
        text = str(error)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            if self.ca_file:
                return f"its certificate is not signed by a CA in {self.ca_file}"
            return (
                "its certificate is not signed by a CA this host trusts: give the CA bundle "
                "(--prometheus-ca-file; the chart's prometheus.tls.ca)"
            )
        if "CERTIFICATE_REQUIRED" in text or "BAD_CERTIFICATE" in text or "UNKNOWN_CA" in text:
            given = "the one given was refused" if self.cert_file else "none was given"
            return (
                f"it asks for a client certificate and {given} (--prometheus-cert-file and "
                "--prometheus-key-file; the chart's prometheus.tls.clientCertSecretName)"
            )
        return "the TLS handshake failed (is it TLS on that port?)"


def _secret(path: str) -> str:
    """A token or password as mounted from a Secret (a trailing newline is not part of it)."""
    return Path(path).read_text(encoding="utf-8").strip()


class BearerFromFile(requests.auth.AuthBase):
    """``Authorization: Bearer <token>``, the token read at every request."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {_secret(self.path)}"
        return request


class BasicFromFile(requests.auth.AuthBase):
    """HTTP basic auth, the password read at every request."""

    def __init__(self, username: str, path: str) -> None:
        self.username = username
        self.path = path

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        basic = requests.auth.HTTPBasicAuth(self.username, _secret(self.path))
        prepared: requests.PreparedRequest = basic(request)
        return prepared


def add_flags(parser: argparse.ArgumentParser, url_help: str | None = None) -> None:
    """The flags that configure :class:`PrometheusAccess` (``--prometheus-url`` only with
    ``url_help``: a command that names its Prometheus otherwise leaves it out)."""
    if url_help is not None:
        parser.add_argument("--prometheus-url", default=DEFAULT_URL, help=url_help)
    parser.add_argument(
        "--prometheus-ca-file", help="PEM bundle of the CA(s) that sign Prometheus' certificate"
    )
    parser.add_argument(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        help="do not verify Prometheus' TLS certificate (testing only)",
    )
    parser.add_argument("--prometheus-cert-file", help="client certificate (PEM), mutual TLS")
    parser.add_argument("--prometheus-key-file", help="its private key (PEM)")
    parser.add_argument(
        "--prometheus-bearer-token-file",
        help="file holding a bearer token, re-read at every query (managed Prometheus services)",
    )
    parser.add_argument("--prometheus-username", help="basic auth user")
    parser.add_argument(
        "--prometheus-password-file", help="file holding the basic auth password, re-read"
    )


def from_args(args: argparse.Namespace) -> PrometheusAccess:
    """The access the flags of :func:`add_flags` describe, or AccessError naming each problem."""
    access = PrometheusAccess(
        default_url=getattr(args, "prometheus_url", DEFAULT_URL),
        ca_file=args.prometheus_ca_file,
        insecure_skip_verify=args.prometheus_insecure_skip_verify,
        cert_file=args.prometheus_cert_file,
        key_file=args.prometheus_key_file,
        bearer_token_file=args.prometheus_bearer_token_file,
        username=args.prometheus_username,
        password_file=args.prometheus_password_file,
    )
    problems = access.problems()
    if problems:
        raise AccessError("\n".join(problems))
    return access
