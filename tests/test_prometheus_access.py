"""How the operator reaches Prometheus: the credentials it sends (a bearer token re-read when
its Secret rotates, basic auth), what a refusal reads as, and flags that cannot work together
refused before the operator starts. TLS against a real Prometheus is in
e2e/test_prometheus_access.py."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from disagg.cli import main
from disagg.prometheus_access import PrometheusAccess
from disagg.reconcile.prometheus import MetricsUnavailable, PrometheusSource, PrometheusSources

ANSWER = {"status": "success", "data": {"resultType": "vector",
          "result": [{"metric": {}, "value": [1700000000, "7"]}]}}  # fmt: skip


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []
    accept: ClassVar[str | None] = None
    """The only Authorization header answered; any other gets 401."""

    def do_GET(self) -> None:
        header = self.headers.get("Authorization")
        type(self).seen.append(header)
        if header != type(self).accept:
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b"Unauthorized")
            return
        body = json.dumps(ANSWER).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"seen": [], "accept": None})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def _query(url: str, access: PrometheusAccess) -> float | None:
    return asyncio.run(PrometheusSource(url, access).query("up"))[0]


def test_a_bearer_token_is_sent_and_re_read_when_its_secret_rotates(
    server: tuple[str, type[_Recorder]], tmp_path: Path
) -> None:
    url, handler = server
    token = tmp_path / "token"
    token.write_text("first-token\n")  # a mounted Secret ends in a newline
    source = PrometheusSource(url, PrometheusAccess(bearer_token_file=str(token)))
    handler.accept = "Bearer first-token"
    assert asyncio.run(source.query("up"))[0] == 7.0
    token.write_text("second-token")
    with pytest.raises(MetricsUnavailable) as refused:
        asyncio.run(source.query("up"))
    assert "refused the credentials (HTTP 401)" in str(refused.value)
    assert "second-token" not in str(refused.value)
    handler.accept = "Bearer second-token"
    assert asyncio.run(source.query("up"))[0] == 7.0
    assert handler.seen == ["Bearer first-token", "Bearer second-token", "Bearer second-token"]


def test_basic_auth_is_sent_with_the_password_from_its_file(
    server: tuple[str, type[_Recorder]], tmp_path: Path
) -> None:
    url, handler = server
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    handler.accept = "Basic b3BlcmF0b3I6czNjcmV0"  # operator:s3cret
    access = PrometheusAccess(username="operator", password_file=str(password))
    assert _query(url, access) == 7.0
    with pytest.raises(MetricsUnavailable, match="HTTP 401"):
        _query(url, PrometheusAccess())
    assert handler.seen == ["Basic b3BlcmF0b3I6czNjcmV0", None]


def test_a_model_that_names_no_prometheus_is_read_from_the_operators(
    server: tuple[str, type[_Recorder]],
) -> None:
    url, _ = server
    sources = PrometheusSources(PrometheusAccess(default_url=url))
    assert sources(None).url == url
    assert sources(None) is sources(url)  # one client per Prometheus
    assert sources("http://other:9090").url == "http://other:9090"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--prometheus-username", "op"], "--prometheus-username and --prometheus-password-file"),
        (
            ["--prometheus-cert-file", "/dev/null"],
            "--prometheus-cert-file and --prometheus-key-file",
        ),
        (["--prometheus-ca-file", "/nonexistent/ca.crt"], "/nonexistent/ca.crt: no such file"),
        (["--prometheus-url", "prometheus:9090"], "--prometheus-url: must start with http://"),
        (
            [
                "--prometheus-bearer-token-file",
                "/dev/null",
                "--prometheus-username",
                "op",
                "--prometheus-password-file",
                "/dev/null",
            ],
            "give a bearer token or basic auth, not both",
        ),
    ],
)
def test_flags_that_cannot_work_are_refused_before_the_operator_starts(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *flags]) == 2
    assert expected in capsys.readouterr().err
