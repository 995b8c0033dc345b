"""Users' trace files: what is read from them, and one clear line for each kind of bad row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.cli import main
from disagg.sim.traffic import load_trace


def test_epoch_and_millisecond_arrivals_are_rebased_to_the_first_request(tmp_path: Path) -> None:
    csv_trace = tmp_path / "epoch.csv"
    csv_trace.write_text(
        "arrival_s,input_tokens,output_tokens\n1700000002.5,50,5\n1700000000.0,100,10\n"
    )
    jsonl_trace = tmp_path / "mooncake.jsonl"
    jsonl_trace.write_text(
        '{"timestamp": 3000, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n\n'
        '{"timestamp": 5500, "input_length": 50, "output_length": 5, "hash_ids": [2]}\n'
    )
    for trace in (csv_trace, jsonl_trace):
        requests = load_trace(trace)
        assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in requests] == [
            (0.0, 100, 10),
            (2.5, 50, 5),
        ]


def test_azure_and_burstgpt_traces_are_read_in_their_own_formats(tmp_path: Path) -> None:
    azure = tmp_path / "AzureLLMInferenceTrace_code.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:16:48.1805900,2048,7\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    burstgpt = tmp_path / "BurstGPT_1.csv"
    burstgpt.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,GPT-4,1087,0,1087,Conversation log\n"  # failed: no response
        "66.5,ChatGPT,3139,195,3334,API log\n"
    )
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in load_trace(azure)] == [
        (0.0, 374, 44), (pytest.approx(4.314579), 396, 109), (61.5, 2048, 7),
    ]  # fmt: skip
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in load_trace(burstgpt)] == [
        (0.0, 472, 18), (61.5, 3139, 195),
    ]  # fmt: skip


def test_the_shared_azure_conversation_trace_is_an_hour_of_19k_requests() -> None:
    shared = Path(__file__).parents[2] / "shared" / "traces"
    trace = shared / "AzureLLMInferenceTrace_conv_2023.csv"
    if not trace.exists():
        pytest.skip(f"{trace} is not beside this checkout")
    requests = load_trace(trace)
    assert len(requests) == 19_366
    assert 3400 < requests[-1].arrival < 3600


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("nan.csv", "arrival,input_tokens,output_tokens\n0.5,100,10\nnan,100,10\n",
         "nan.csv: row 2: arrival must be a finite number >= 0"),
        ("inf.csv", "arrival_s,input_tokens,output_tokens\ninf,100,10\n",
         "inf.csv: row 1: arrival must be a finite number >= 0"),
        ("negative.csv", "arrival,input_tokens,output_tokens\n-1,100,10\n",
         "negative.csv: row 1: arrival must be a finite number >= 0"),
        ("zero.csv", "arrival,input_tokens,output_tokens\n1,0,10\n",
         "zero.csv: row 1: token counts must be >= 1"),
        ("columns.csv", "a,b\n1,2\n", "columns.csv: row 1: needs arrival, input_tokens"),
        ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:15,374,44\n",
         "azure.csv: row 1: needs arrival, input_tokens, output_tokens, or Azure's TIMESTAMP, "
         "ContextTokens, GeneratedTokens, or BurstGPT's Timestamp, Request tokens, Response "
         "tokens (TIMESTAMP '16/11/2023 18:15' is not a date and time)"),
        ("burst.csv", "Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,,18\n",
         "burst.csv: row 1: needs arrival"),
        ("cut.jsonl", '{"arrival": 0.5, "input_tokens": 100, "output_tokens": 10}\n\n{"arrival": 1,\n',
         "cut.jsonl: row 3: not JSON"),
        ("list.jsonl", "[1, 2, 3]\n", "list.jsonl: row 1: needs arrival, input_tokens, output_tokens, or Azure's TIMESTAMP, "
         "ContextTokens, GeneratedTokens, or BurstGPT's Timestamp, Request tokens, Response tokens "
         "(a list"),
        ("huge.jsonl", '{"arrival": 0, "input_tokens": Infinity, "output_tokens": 1}\n',
         "huge.jsonl: row 1: needs arrival, input_tokens, output_tokens"),
        # Epoch milliseconds read as seconds: 41 days, which would tick the policy 240,000 times.
        ("millis.csv", "arrival,input_tokens,output_tokens\n1700003600000,100,10\n"
         "1700000000000,100,10\n1700000100000,100,10\n",
         "millis.csv: arrivals span 3.6e+06s (row 2 at 1700000000000s to row 1 at 1700003600000s), "
         "longer than the 7 days the simulator replays"),
    ],
)  # fmt: skip
def test_a_bad_trace_row_is_named_in_one_line(
    name: str, content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / name
    trace.write_text(content)
    assert main(["simulate", "--trace", str(trace), "--policy", "ours"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_binary_file_is_not_read_as_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "dump.csv"
    trace.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["simulate", "--trace", str(trace)]) == 1
    err = capsys.readouterr().err
    assert "dump.csv: not UTF-8 text" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--provisioning-delay", "nan"], "--provisioning-delay must be >= 0"),
        (["--duration", "inf"], "--duration must be finite"),
        (["--rate", "inf"], "--rate must be finite"),
        (["--interval", "nan"], "--interval must be greater than zero"),
        (["--interval", "0.001"], "--interval must be at least 1 second"),
        (["--duration", "1e12"], "--duration must be at most 604800 seconds (7 days)"),
    ],
)
def test_a_number_that_would_never_finish_is_refused(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_empty_trace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "empty.csv"
    trace.write_text("arrival,input_tokens,output_tokens\n")
    assert main(["simulate", "--trace", str(trace)]) == 1
    assert "empty.csv: no requests in it" in capsys.readouterr().err


def short_requests_and(tmp_path: Path, rows: list[str], *long: str) -> Path:
    """A trace of ``rows`` (``arrival_s,input_tokens,output_tokens``) with ``long`` added."""
    trace = tmp_path / "trace.csv"
    lines = ["arrival_s,input_tokens,output_tokens", *rows, *long]
    trace.write_text("\n".join(lines) + "\n")
    return trace


def test_a_request_no_engine_can_hold_is_refused_not_left_to_block_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One 5M-token prompt and one 2M-token answer among 600 short requests: more than one
    # engine's KV cache holds. Waiting for room that never comes, they blocked every request
    # behind them (296 of 635 finished); vLLM refuses them on arrival.
    rows = [f"{i * 0.5:.3f},500,100" for i in range(600)]
    trace = short_requests_and(tmp_path, rows, "150.0,5000000,100", "151.0,200,2000000")
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 602 and summary["rejected"] == 2
    assert summary["finished"] == 600 and summary["attainment"]["both"] > 0.99
    assert main(["simulate", "--trace", str(trace)]) == 0
    assert "602 (600 finished, 2 refused: longer than the model's context or an engine's KV" in (
        capsys.readouterr().out
    )


def test_a_request_longer_than_the_models_context_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Llama-3.1 serves 131072 tokens of prompt plus output. One 8B engine's KV cache holds
    # several times that, but vLLM refuses the request all the same: so does the simulator.
    rows = [f"{i * 0.5:.3f},500,100" for i in range(100)]
    trace = short_requests_and(tmp_path, rows, "20.0,131000,72", "21.0,131000,73")
    flags = ["--model", "llama-3.1-8b", "--ttft", "60", "--json"]
    assert main(["simulate", "--trace", str(trace), *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 102 and summary["rejected"] == 1, summary
    assert summary["finished"] == 101
