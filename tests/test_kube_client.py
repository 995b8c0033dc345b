"""KubeClient over real HTTP: a local aiohttp server answers as the API server would, so the
transport's framing, query encoding, error answers and dead connections are tested for real."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from disagg.kube.client import KubeClient, KubeError, KubeUnreachable
from disagg.kube.credentials import Credentials

Seen = list[tuple[str, str, dict[str, str], dict[str, str], bytes]]


def _creds(port: int, prefix: str = "") -> Credentials:
    return Credentials(
        host=f"http://127.0.0.1:{port}{prefix}",
        token="t0ken",
        ca_file=None,
        cert_file=None,
        key_file=None,
        verify=False,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, Seen, dict[str, Any]]]:
    seen: Seen = []
    behaviour: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(
            (request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            response.content_type = "application/json"
            await response.prepare(request)
            payload = b"".join(json.dumps(e).encode() + b"\n" for e in behaviour["events"])
            for start in range(0, len(payload), 7000):  # lines cut across chunks
                await response.write(payload[start : start + 7000])
            await response.write_eof()
            return response
        if "refuse" in behaviour:
            status, answer = behaviour["refuse"]
            return web.Response(status=status, body=answer, content_type="application/json")
        if request.method == "DELETE":
            return web.json_response({"kind": "Status", "status": "Success"})
        return web.json_response(
            {"kind": "Thing", "metadata": {"name": "x"}, "echo": body.decode()}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield port, seen, behaviour
    finally:
        await runner.cleanup()


async def test_apply_sends_the_object_as_an_apply_patch_with_auth_and_counts_the_write(
    server: tuple[int, Seen, dict[str, Any]],
) -> None:
    port, seen, _ = server
    writes: list[tuple[str, str]] = []
    client = KubeClient(_creds(port, "/proxy/c-1"), on_write=lambda k, v: writes.append((k, v)))
    try:
        obj = {"kind": "Deployment", "metadata": {"name": "m/x y", "namespace": "team a"}}
        answer = await client.apply(obj)
    finally:
        await client.close()
    method, path, query, headers, body = seen[0]
    assert (method, path) == (
        "PATCH",
        "/proxy/c-1/apis/apps/v1/namespaces/team a/deployments/m/x y",
    )
    assert query == {"fieldManager": "disagg-operator", "force": "true"}
    assert headers["Content-Type"] == "application/apply-patch+yaml"
    assert headers["Authorization"] == "Bearer t0ken"
    assert json.loads(body) == obj
    assert json.loads(answer["echo"]) == obj
    assert writes == [("Deployment", "apply")]


async def test_a_label_selector_reaches_the_server_intact(
    server: tuple[int, Seen, dict[str, Any]],
) -> None:
    port, seen, _ = server
    client = KubeClient(_creds(port))
    selector = "disagg.dev/model,app.kubernetes.io/managed-by in (disagg-operator),tier!=x"
    try:
        await client.list_objects("Pod", None, selector)
    finally:
        await client.close()
    assert seen[0][1] == "/api/v1/pods"
    assert seen[0][2] == {"labelSelector": selector}


async def test_a_refusal_carries_the_servers_reason_and_message(
    server: tuple[int, Seen, dict[str, Any]],
) -> None:
    port, _, behaviour = server
    status = {"kind": "Status", "reason": "Invalid", "message": "spec.replicas: must be >= 0"}
    behaviour["refuse"] = (422, json.dumps(status).encode())
    client = KubeClient(_creds(port))
    try:
        with pytest.raises(KubeError) as refused:
            await client.patch("Deployment", "ns", "x", {"spec": {"replicas": -1}})
        behaviour["refuse"] = (404, b"not json at all")
        assert await client.get("Deployment", "ns", "gone") is None
        behaviour["refuse"] = (503, b"<html>proxy down</html>")
        with pytest.raises(KubeError) as proxied:
            await client.get("Deployment", "ns", "x")
    finally:
        await client.close()
    assert (refused.value.status, refused.value.reason) == (422, "Invalid")
    assert refused.value.message == "spec.replicas: must be >= 0"
    assert proxied.value.status == 503
    assert "proxy down" in proxied.value.message


async def test_watch_yields_events_whose_lines_exceed_64_kib_and_cross_chunks(
    server: tuple[int, Seen, dict[str, Any]],
) -> None:
    port, seen, behaviour = server
    big = {"metadata": {"name": "big", "resourceVersion": "7"}, "data": {"k": "v" * 200_000}}
    behaviour["events"] = [
        {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}},
        {"type": "MODIFIED", "object": big},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
    ]
    client = KubeClient(_creds(port))
    try:
        events = [e async for e in client.watch("Pod", "ns", "disagg.dev/model", "4")]
    finally:
        await client.close()
    assert [(kind, obj["metadata"]["resourceVersion"]) for kind, obj in events] == [
        ("ADDED", "5"),
        ("MODIFIED", "7"),
        ("BOOKMARK", "9"),
    ]
    assert events[1][1] == big
    assert seen[0][2]["resourceVersion"] == "4"
    assert seen[0][2]["labelSelector"] == "disagg.dev/model"


async def test_an_unreachable_server_raises_a_kube_error_naming_the_call() -> None:
    client = KubeClient(_creds(_free_port()))
    try:
        with pytest.raises(KubeUnreachable) as failed:
            await asyncio.wait_for(client.get("Lease", "ns", "leader"), 10)
        with pytest.raises(KubeError):
            async for _ in client.watch("Pod", "ns", None, "1"):
                pass
    finally:
        await client.close()
    assert failed.value.status == 0
    assert "GET /apis/coordination.k8s.io/v1/namespaces/ns/leases/leader" in str(failed.value)
