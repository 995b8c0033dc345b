"""The data plane as real processes on loopback: router + 2 prefill + 2 decode simulators."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from dataplane import (
    Proc,
    StreamResult,
    engine,
    histogram,
    histogram_p99,
    host_lag_p99,
    long_prompt,
    router,
    run,
    start,
    stream_completion,
)
from disagg.router.protocol import PREFILL_KV_PARAMS
from harness import Kube, wait_for

THRESHOLD = 64


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, list[Proc]]]:
    prefill = [engine(f"prefill-{i}", f"127.43.1.{i}", "prefill") for i in (1, 2)]
    decode = [engine(f"decode-{i}", f"127.43.2.{i}", "decode") for i in (1, 2)]
    front = router("router", "127.43.0.1", prefill, decode, "--pd-threshold", str(THRESHOLD))
    procs = {"prefill": prefill, "decode": decode, "router": [front]}
    yield procs
    for group in procs.values():
        for proc in group:
            proc.stop()


def _recent(proc: Proc, request_id: str) -> list[dict[str, object]]:
    return [
        r for r in proc.get("/admin/requests") if r["headers"].get("x-request-id") == request_id
    ]  # type: ignore[index,union-attr]


def test_streamed_chat_goes_prefill_then_decode_with_the_exact_protocol(
    fleet: dict[str, list[Proc]],
) -> None:
    front = fleet["router"][0]
    prompt = long_prompt(400)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
    }
    with httpx.stream(
        "POST",
        front.url + "/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": "req-chat-1"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["X-Disagg-Path"] == "disaggregated"
        assert response.headers["X-Request-Id"] == "req-chat-1"
        events = [
            line.removeprefix("data: ")
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len(content) == 12 and all(content)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 404,
        "completion_tokens": 12,
        "total_tokens": 416,
    }

    seen_prefill = [r for p in fleet["prefill"] for r in _recent(p, "req-chat-1")]
    seen_decode = [r for d in fleet["decode"] for r in _recent(d, "req-chat-1")]
    assert len(seen_prefill) == 1 and len(seen_decode) == 1
    sent_to_prefill = seen_prefill[0]["body"]
    expected = {k: v for k, v in body.items() if k != "stream_options"}
    expected.update(max_tokens=1, stream=False, kv_transfer_params=PREFILL_KV_PARAMS)
    assert sent_to_prefill == expected
    sent_to_decode = seen_decode[0]["body"]
    params = sent_to_decode.pop("kv_transfer_params")  # type: ignore[union-attr]
    assert sent_to_decode == body
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_host"] in ("127.43.1.1", "127.43.1.2") and params["remote_port"] == 5600
    for key in ("remote_engine_id", "remote_request_id", "remote_block_ids", "tp_size"):
        assert params[key] is not None


def test_short_prompt_skips_prefill(fleet: dict[str, list[Proc]]) -> None:
    front = fleet["router"][0]
    response = httpx.post(
        front.url + "/v1/completions",
        headers={"X-Request-Id": "req-short"},
        json={"model": "m", "prompt": "hello there", "max_tokens": 3},
        timeout=30,
    )
    assert response.status_code == 200 and response.headers["X-Disagg-Path"] == "skipped"
    assert response.json()["usage"]["completion_tokens"] == 3
    assert not [r for p in fleet["prefill"] for r in _recent(p, "req-short")]
    decoded = [r for d in fleet["decode"] for r in _recent(d, "req-short")]
    assert len(decoded) == 1 and "kv_transfer_params" not in decoded[0]["body"]  # type: ignore[operator]
    metrics = httpx.get(front.url + "/metrics").text
    assert 'disagg_router_requests_total{code="200",path="skipped"}' in metrics


def _body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


MALFORMED = {
    "bad-json": ("/v1/completions", b"{not json", 400, "not valid JSON"),
    "no-model": ("/v1/completions", json.dumps({"prompt": "x"}).encode(), 400, "model is required"),
    "no-prompt": ("/v1/completions", _body(), 400, "prompt is required"),
    "no-messages": ("/v1/chat/completions", _body(messages=[]), 400, "messages is required"),
    "unknown-model": ("/v1/completions", _body(model="other", prompt="x"), 404, "does not exist"),
    "bad-stream": ("/v1/completions", _body(prompt="x", stream="yes"), 400, "stream must be"),
    "too-large": ("/v1/completions", _body(prompt="x" * (5 * 1024 * 1024)), 413, "exceeds"),
    "not-object": ("/v1/completions", b"[1, 2]", 400, "JSON object"),
    "deep-nesting": (
        "/v1/completions",
        b'{"model": "m", "prompt": ' + b"[" * 900 + b"]" * 900 + b"}",
        400,
        "nested deeper than 64",
    ),
    "huge-integer": (
        "/v1/completions",
        b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        400,
        "not valid JSON",
    ),
    "message-not-object": ("/v1/chat/completions", _body(messages=[1]), 400, "messages[0]"),
    "message-null": ("/v1/chat/completions", _body(messages=[None]), 400, "messages[0]"),
    "empty-prompt-part": ("/v1/completions", _body(prompt=[""]), 400, "prompt[0]"),
    "bad-stream-options": (
        "/v1/completions",
        _body(prompt="x", stream=True, stream_options="x"),
        400,
        "stream_options must be an object",
    ),
    "router-field": (
        "/v1/completions",
        _body(prompt="x", bootstrap_room=7),
        400,
        "set by the router",
    ),
    "zero-max-tokens": ("/v1/completions", _body(prompt="x", max_tokens=0), 400, "max_tokens must"),
}


@pytest.mark.parametrize(
    ("path", "payload", "status", "fragment"), MALFORMED.values(), ids=MALFORMED
)
def test_malformed_requests_get_openai_errors(
    fleet: dict[str, list[Proc]], path: str, payload: bytes, status: int, fragment: str
) -> None:
    front = fleet["router"][0]
    response = httpx.post(
        front.url + path, content=payload, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["code"] == status
    assert httpx.get(front.url + "/health").status_code == 200


def test_an_undeclared_charset_is_refused_not_a_server_error(fleet: dict[str, list[Proc]]) -> None:
    response = httpx.post(
        fleet["router"][0].url + "/v1/completions",
        content=_body(prompt="x"),
        headers={"Content-Type": "application/json; charset=nope"},
        timeout=30,
    )
    assert response.status_code == 415 and "charset" in response.json()["error"]["message"]


def test_engine_client_errors_pass_through_once_and_slow_bodies_are_cut_off(
    fleet: dict[str, list[Proc]],
) -> None:
    # A router that accepts any model name leaves the engine to refuse an unknown one.
    any_model = start(
        "router-any-model", "router", "--host", "127.43.0.2", "--port", "8000",
        "--prefill", *(p.url for p in fleet["prefill"]), "--decode", *(d.url for d in fleet["decode"]),
        "--pd-threshold", str(THRESHOLD), "--body-timeout", "1", url="http://127.43.0.2:8000",
    )  # fmt: skip
    try:
        before = httpx.get(any_model.url + "/metrics").text
        response = httpx.post(
            any_model.url + "/v1/completions",
            headers={"X-Request-Id": "unknown-model"},
            json={"model": "nope", "prompt": long_prompt(200), "max_tokens": 2},
            timeout=30,
        )
        assert response.status_code == 404 and "does not exist" in response.text
        calls = [r for e in fleet["prefill"] + fleet["decode"] for r in _recent(e, "unknown-model")]
        assert len(calls) == 1  # the prefill engine's answer, not retried nor sent to decode
        after = httpx.get(any_model.url + "/metrics").text
        assert _failures(after) == _failures(before)

        async def slow_client() -> bytes:
            reader, writer = await asyncio.open_connection("127.43.0.2", 8000)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b'\r\nContent-Length: 100\r\n\r\n{"model"'
            )
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(65536), timeout=20)
            writer.close()
            return answer

        answer = asyncio.run(slow_client())
        assert answer.startswith(b"HTTP/1.1 408") and b"took longer than 1s" in answer
    finally:
        any_model.stop()


def test_slow_loris_connections_are_cut_off_while_others_are_served(
    fleet: dict[str, list[Proc]],
) -> None:
    front = start(
        "router-header-timeout", "router", "--host", "127.43.0.3", "--port", "8000",
        "--decode", *(d.url for d in fleet["decode"]), "--header-timeout", "1",
        url="http://127.43.0.3:8000",
    )  # fmt: skip
    try:

        async def loris() -> tuple[list[float], int]:
            """300 connections that send a request line and then a header byte now and then;
            returns when each was closed (seconds after opening) and how many requests the
            router answered meanwhile."""
            answered = 0

            async def slow() -> float:
                reader, writer = await asyncio.open_connection("127.43.0.3", 8000)
                opened = asyncio.get_running_loop().time()
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                try:
                    while not reader.at_eof():
                        writer.write(b"a")
                        await writer.drain()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(reader.read(1024), 0.3)
                except ConnectionError:
                    pass
                writer.close()
                return asyncio.get_running_loop().time() - opened

            async def served() -> None:
                nonlocal answered
                async with httpx.AsyncClient(timeout=10) as client:
                    for _ in range(10):
                        r = await client.post(
                            front.url + "/v1/completions",
                            json={"model": "m", "prompt": "hi", "max_tokens": 2},
                        )
                        answered += r.status_code == 200

            closed = await asyncio.wait_for(
                asyncio.gather(*(slow() for _ in range(300)), served()), timeout=30
            )
            return [c for c in closed if c is not None], answered

        closed, answered = run(loris())
        assert len(closed) == 300 and max(closed) < 4, sorted(closed)[-5:]
        assert answered == 10
        metrics = httpx.get(front.url + "/metrics").text
        assert 'disagg_router_client_timeouts_total{phase="headers"} 300.0' in metrics
    finally:
        front.stop()


def _failures(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("disagg_router_upstream_failures_total")
    )


def test_failed_decode_before_first_token_is_retried_elsewhere(
    fleet: dict[str, list[Proc]],
) -> None:
    front, broken = fleet["router"][0], fleet["decode"][0]
    broken.post("/admin/faults", {"error_rate": 1.0})
    try:
        for i in range(6):
            response = httpx.post(
                front.url + "/v1/completions",
                timeout=30,
                headers={"X-Request-Id": f"retry-{i}"},
                json={"model": "m", "prompt": long_prompt(200), "max_tokens": 2},
            )
            assert response.status_code == 200, response.text
            assert response.headers["X-Disagg-Path"] == "disaggregated"
    finally:
        broken.post("/admin/faults", {"error_rate": 0.0})


def test_client_disconnect_cancels_the_engine_request(fleet: dict[str, list[Proc]]) -> None:
    front = fleet["router"][0]

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "prompt": "short", "max_tokens": 5000, "stream": True}
            async with session.post(front.url + "/v1/completions", json=body) as response:
                assert response.status == 200
                await response.content.readuntil(b"\n\n")

    run(go())

    def idle() -> bool:
        return all(d.get("/admin/state")["running"] == 0 for d in fleet["decode"])

    wait_for("the decode engines to drop the abandoned request", idle, timeout=10, interval=0.05)


def test_killing_a_prefill_engine_mid_run_fails_no_request(tmp_path: object) -> None:
    prefill = [engine(f"kill-prefill-{i}", f"127.43.4.{i}", "prefill") for i in (1, 2)]
    decode = [engine(f"kill-decode-{i}", f"127.43.5.{i}", "decode") for i in (1, 2)]
    front = router(
        "kill-router",
        "127.43.4.100",
        prefill,
        decode,
        "--pd-threshold",
        "16",
        "--prefill-timeout",
        "5",
    )
    try:

        async def load() -> list[StreamResult]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                tasks = []
                for i in range(60):
                    tasks.append(
                        asyncio.create_task(
                            stream_completion(session, front.url, long_prompt(300 + i), 8)
                        )
                    )
                    await asyncio.sleep(0.02)
                    if i == 20:
                        prefill[0].kill()
                return await asyncio.gather(*tasks)

        results = run(load())
        failures = [r for r in results if r.status != 200 or r.error or r.chunks != 8]
        assert not failures, failures[:3]
        paths = {r.path for r in results}
        assert "disaggregated" in paths
        assert prefill[0].process.returncode is not None
    finally:
        for proc in (*prefill, *decode, front):
            proc.stop()


ITL = "vllm:inter_token_latency_seconds"


def test_with_the_whole_prefill_pool_down_decode_serves_alone(tmp_path: object) -> None:
    prefill = engine("down-prefill", "127.43.6.1", "prefill")
    decode = engine("down-decode", "127.43.6.2", "decode")
    front = router(
        "down-router", "127.43.6.100", [prefill], [decode], "--pd-threshold", "16",
        "--prefill-timeout", "5",
    )  # fmt: skip
    try:
        prefill.kill()

        async def load() -> list[StreamResult]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                # The first finds the prefill engine unreachable; the rest find it marked down.
                first = await stream_completion(session, front.url, long_prompt(300), 8)
                rest = await asyncio.gather(
                    *(
                        stream_completion(session, front.url, long_prompt(301 + i), 8)
                        for i in range(19)
                    )
                )
                return [first, *rest]

        results = run(load())
        failures = [r for r in results if r.status != 200 or r.error or r.chunks != 8]
        assert not failures, failures[:3]
        # Every request was served decode-only and says so, in its header and the metrics.
        assert {r.path for r in results} == {"fallback"}
        metrics = httpx.get(front.url + "/metrics").text
        assert 'disagg_router_requests_total{code="200",path="fallback"} 20.0' in metrics
        assert decode.get("/admin/state")["accepted"] == 20
    finally:
        for proc in (front, prefill, decode):
            proc.stop()


def test_a_backed_up_prefill_engine_has_short_prompts_prefilled_by_decode_engines() -> None:
    # Each prefill step takes 1.5 s more (in real time): the router knows nothing of the
    # engine until its first answer, then reads a wait far past 0.5 s (every prompt sent
    # since is in flight, and it finished 300 tokens in 1.5 s).
    prefill = engine(
        "off-prefill", "127.43.9.1", "prefill", "--fault-added-latency-ms", "1500",
        time_scale=1.0,
    )  # fmt: skip
    decode = [engine(f"off-decode-{i}", f"127.43.9.{i + 1}", "decode") for i in (1, 2)]
    front = router(
        "off-router", "127.43.9.100", [prefill], decode, "--pd-threshold", "16",
        "--offload-max-tokens", "2048", "--offload-wait", "0.5",
    )  # fmt: skip
    try:

        async def load() -> list[StreamResult]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                tasks = []
                for i in range(60):
                    prompt = long_prompt(300 + i)
                    tasks.append(
                        asyncio.create_task(stream_completion(session, front.url, prompt, 8))
                    )
                    await asyncio.sleep(0.05)
                return await asyncio.gather(*tasks)

        results = run(load())
        failures = [r for r in results if r.status != 200 or r.error or r.chunks != 8]
        assert not failures, failures[:3]
        paths = [r.path for r in results]
        assert paths[0] == "disaggregated", "nothing known of the prefill engine yet"
        offloaded = paths.count("offloaded")
        assert offloaded and offloaded + paths.count("disaggregated") == len(paths), paths
        metrics = httpx.get(front.url + "/metrics").text
        assert (
            f'disagg_router_requests_total{{code="200",path="offloaded"}} {offloaded}.0' in metrics
        )
        view = httpx.get(front.url + "/debug/endpoints").json()
        assert [row["local_prefills"] for row in view["decode"]] == [0, 0], "all released"
    finally:
        for proc in (front, prefill, *decode):
            proc.stop()


def test_a_decode_engine_killed_mid_stream_ends_its_streams_with_an_error(
    tmp_path: object,
) -> None:
    decode = [engine(f"mid-decode-{i}", f"127.43.8.{i}", "decode", time_scale=0.5) for i in (1, 2)]
    front = router("mid-router", "127.43.8.100", [], decode)
    try:

        async def load() -> list[StreamResult]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                tasks = [
                    asyncio.create_task(stream_completion(session, front.url, "hi", 400))
                    for _ in range(12)
                ]
                await asyncio.sleep(0.3)  # every stream is under way
                decode[0].kill()
                return await asyncio.gather(*tasks)

        results = run(load())
        whole = [r for r in results if r.status == 200 and not r.error and r.chunks == 400]
        cut = [r for r in results if r.status == 200 and r.error]
        refused = [r for r in results if r.status == 503]
        # Each stream either finished, or ended with an error event; none went quiet or
        # came back longer than asked (a retry mid-stream would repeat tokens).
        assert len(whole) + len(cut) + len(refused) == len(results), results
        assert whole and cut, (len(whole), len(cut))
        assert all(0 < r.chunks < 400 for r in cut)
    finally:
        for proc in (front, *decode):
            proc.stop()


def _established_to(host: str, port: int) -> int:
    """TCP connections open to host:port on this machine (from /proc/net/tcp)."""
    address = "".join(f"{int(octet):02X}" for octet in reversed(host.split("."))) + f":{port:04X}"
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if row.split()[2] == address and row.split()[3] == "01")


def test_connections_to_the_engines_are_bounded(tmp_path: object) -> None:
    decode = engine("bounded-decode", "127.43.7.2", "decode")
    front = router(
        "bounded-router", "127.43.7.100", [], [decode], "--max-upstream-connections", "4"
    )
    try:
        most = 0

        async def load() -> list[StreamResult]:
            nonlocal most
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                tasks = [
                    asyncio.create_task(stream_completion(session, front.url, "hi", 40))
                    for _ in range(60)
                ]
                while not all(t.done() for t in tasks):
                    most = max(most, _established_to("127.43.7.2", 8000))
                    await asyncio.sleep(0.01)
                return [t.result() for t in tasks]

        results = run(load())
        assert all(r.status == 200 and r.chunks == 40 for r in results), results[:3]
        # 60 concurrent streams share four connections; more requests wait for one.
        assert 1 <= most <= 4, most
    finally:
        front.stop()
        decode.stop()


def _interference(colocated: bool, budget: int, subnet: int) -> tuple[float, float, float]:
    """ITL p99 of 8 running streams as their engine reports it (what Prometheus and the
    autoscaler see): undisturbed, and overall while a 16k-token prompt arrives; and the
    host's p99 lag waking that engine (wall seconds), to tell a busy host from a stall."""
    net = f"127.43.{subnet}"
    flags = ("--max-num-batched-tokens", str(budget))
    if colocated:
        worker = engine(f"itl-both-{subnet}", f"{net}.1", "both", *flags, time_scale=0.5)
        procs, url, decoder = [worker], worker.url, worker.url
    else:
        p = engine(f"itl-prefill-{subnet}", f"{net}.1", "prefill", *flags, time_scale=0.5)
        d = engine(f"itl-decode-{subnet}", f"{net}.2", "decode", *flags, time_scale=0.5)
        front = router(f"itl-router-{subnet}", f"{net}.3", [p], [d], "--pd-threshold", "1000")
        procs, url, decoder = [p, d, front], front.url, d.url
    try:

        async def measure() -> tuple[float, float, float]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                before = await histogram(session, decoder, ITL)
                streams = [
                    asyncio.create_task(stream_completion(session, url, "chat turn", 160))
                    for _ in range(8)
                ]
                await asyncio.sleep(0.4)  # let the streams settle into steady decoding first
                settled = await histogram(session, decoder, ITL)
                intruder = await stream_completion(session, url, long_prompt(16000), 2)
                assert intruder.status == 200, intruder.error
                results = await asyncio.gather(*streams)
                for result in results:
                    assert result.status == 200 and result.chunks == 160, result.error
                after = await histogram(session, decoder, ITL)
                lag = await host_lag_p99(session, decoder)
            return histogram_p99(settled, before), histogram_p99(after, before), lag

        return run(measure())
    finally:
        for proc in procs:
            proc.stop()


def test_a_long_prompt_stalls_colocated_decode_but_not_disaggregated_decode() -> None:
    colocated_quiet, colocated_disturbed, lag = _interference(True, budget=8192, subnet=10)
    split_quiet, split_disturbed, split_lag = _interference(False, budget=8192, subnet=11)
    seen = dict(
        colocated=(colocated_quiet, colocated_disturbed), split=(split_quiet, split_disturbed),
        host_lag=(lag, split_lag),
    )  # fmt: skip
    # One 16k-token prompt in a colocated engine stretches every running stream's token gap...
    assert colocated_disturbed > 5 * colocated_quiet, seen
    # ...while on a decode-only engine the prompt's KV arrives ready and nothing stalls.
    assert split_disturbed < 2 * split_quiet, seen
    assert split_disturbed < colocated_disturbed / 3, seen


def test_chunked_prefill_softens_the_stall() -> None:
    _, big_budget, lag = _interference(colocated=True, budget=8192, subnet=12)
    _, small_budget, small_lag = _interference(colocated=True, budget=512, subnet=13)
    assert small_budget < big_budget / 2, (small_budget, big_budget, (lag, small_lag))


def test_router_discovers_pool_pods_through_the_api_server(kube: Kube, namespace: str) -> None:
    for role in ("prefill", "decode"):
        kube.run(
            "create",
            "deployment",
            f"pool-{role}",
            "--image=example.invalid/engine",
            "--replicas=2",
            "--port=8000",
            "-n",
            namespace,
        )
        kube.run("label", "deployment", f"pool-{role}", f"disagg.dev/role={role}", "-n", namespace)
        kube.run(
            "patch",
            "deployment",
            f"pool-{role}",
            "-n",
            namespace,
            "--type=json",
            "-p",
            json.dumps(
                [
                    {
                        "op": "add",
                        "path": "/spec/template/metadata/labels/disagg.dev~1role",
                        "value": role,
                    },
                    {
                        "op": "add",
                        "path": "/spec/template/spec/containers/0/ports/0/name",
                        "value": "http",
                    },
                ]
            ),
        )
    front = start(
        "discovery-router",
        "router",
        "--host",
        "127.43.30.1",
        "--port",
        "8000",
        "--discover",
        "--kubeconfig",
        str(kube.layout.kubeconfig),
        "--namespace",
        namespace,
        "--prefill-selector",
        "disagg.dev/role=prefill",
        "--decode-selector",
        "disagg.dev/role=decode",
        url="http://127.43.30.1:8000",
        ready_path="/debug/endpoints",
    )
    try:

        def discovered() -> dict[str, list[dict[str, object]]] | None:
            view = front.get("/debug/endpoints")
            ready = all(
                len([e for e in view[r] if not e["draining"]]) == 2 for r in ("prefill", "decode")
            )
            return view if ready else None

        view = wait_for("two ready endpoints per pool", discovered, timeout=60)
        pods = {
            p["metadata"]["name"]: p
            for p in kube.items("pods", namespace, "disagg.dev/role=prefill")
            if not p["metadata"].get("deletionTimestamp")
        }
        urls = {f"http://{p['status']['podIP']}:8000" for p in pods.values()}
        assert {e["url"] for e in view["prefill"]} == urls

        victim = sorted(pods)[0]
        kube.run("delete", "pod", victim, "-n", namespace, "--wait=false")
        wait_for(
            "the deleted pod to leave the prefill pool",
            lambda: victim not in {e["name"] for e in front.get("/debug/endpoints")["prefill"]},
            timeout=30,
        )
    finally:
        front.stop()


def test_sglang_mode_pairs_prefill_and_decode_through_bootstrap_rooms() -> None:
    prefill = engine("sglang-prefill", "127.43.40.1", "prefill")
    decode = engine("sglang-decode", "127.43.40.2", "decode")
    front = start(
        "sglang-router",
        "router",
        "--host",
        "127.43.40.3",
        "--port",
        "8000",
        "--served-model-name",
        "m",
        "--backend",
        "sglang",
        "--prefill",
        prefill.url,
        "--decode",
        decode.url,
        "--prefill-bootstrap-port",
        "5600",
        url="http://127.43.40.3:8000",
    )
    try:
        body = {"model": "m", "prompt": long_prompt(500), "max_tokens": 6, "stream": True}
        with httpx.stream(
            "POST",
            front.url + "/v1/completions",
            json=body,
            headers={"X-Request-Id": "sg-1"},
            timeout=30,
        ) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line.startswith("data: {")]
        assert len(events) == 6
        sent_p = [
            r for r in prefill.get("/admin/requests") if r["headers"].get("x-request-id") == "sg-1"
        ]
        sent_d = [
            r for r in decode.get("/admin/requests") if r["headers"].get("x-request-id") == "sg-1"
        ]
        assert len(sent_p) == 1 and len(sent_d) == 1
        p_body, d_body = sent_p[0]["body"], sent_d[0]["body"]
        # The same request, with the same bootstrap fields, goes to both engines.
        assert p_body == d_body
        assert p_body["bootstrap_host"] == "127.43.40.1" and p_body["bootstrap_port"] == 5600
        assert isinstance(p_body["bootstrap_room"], int) and 0 <= p_body["bootstrap_room"] < 2**63
        assert p_body["max_tokens"] == 6 and "kv_transfer_params" not in p_body
    finally:
        for proc in (front, prefill, decode):
            proc.stop()


def test_sglang_decode_waits_for_a_room_the_prefill_engine_has_not_seen_yet() -> None:
    """The router fires both requests at once, so decode may ask for the KV first."""
    prefill = engine("sglang-late-prefill", "127.43.41.1", "prefill")
    decode = engine("sglang-early-decode", "127.43.41.2", "decode")
    paired = {
        "model": "m",
        "prompt": long_prompt(300),
        "max_tokens": 4,
        "bootstrap_host": "127.43.41.1",
        "bootstrap_port": 5600,
        "bootstrap_room": 424242,
    }

    async def scenario() -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            decode_call = asyncio.create_task(
                session.post(decode.url + "/v1/completions", json=paired)
            )
            await asyncio.to_thread(
                wait_for,
                "the decode engine to receive the paired request",
                lambda: [
                    r for r in decode.get("/admin/requests") if r["path"].endswith("completions")
                ],
                10,
            )
            async with session.post(prefill.url + "/v1/completions", json=paired) as answer:
                assert answer.status == 200, await answer.text()
            async with await decode_call as response:
                return response.status, await response.json()

    try:
        status, body = run(scenario())
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 4  # type: ignore[index]
    finally:
        for proc in (prefill, decode):
            proc.stop()
