"""Facts about the pinned vLLM and SGLang, read from their published sources (`make facts`).

The renderer, the simulator and the autoscaler speak the engines' command lines, KV-transfer
config and metrics; this script writes what the pinned releases actually define into
`upstream/facts.json`, and `tests/test_upstream_facts.py` checks the project against it. To
bump an engine: change `disagg/versions.py`, run `make facts`, and read what the tests say.
Nothing is imported or executed: every fact comes from `ast` (`source.py` fetches the
releases and holds the readers).

`--check` regenerates in memory and fails, naming what changed, when the committed file is
out of date (`make test` runs it).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any, Final

from source import (
    FactError,
    Source,
    calls,
    fetch,
    field_name,
    fields,
    find_class,
    flag,
    keyword,
    module_literals,
    name_of,
    option_literals,
    subscript_items,
)

from disagg.versions import SGLANG_VERSION, VLLM_VERSION

ROOT = Path(__file__).resolve().parent.parent

FACTS = ROOT / "upstream" / "facts.json"


# --- vLLM -----------------------------------------------------------------------------

_VLLM_METRIC_KINDS = {
    "_gauge_cls": "gauge",
    "_counter_cls": "counter",
    "_histogram_cls": "histogram",
}


def vllm_facts(src: Source) -> dict[str, Any]:
    flags: set[str] = set()
    for path in ("vllm/engine/arg_utils.py", "vllm/entrypoints/cli/serve.py"):
        flags |= option_literals(src.tree(path))
    frontend = "vllm/entrypoints/common/cli_args.py"
    tree = src.tree(frontend)
    flags |= option_literals(tree)
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        flags |= {flag(field_name(f)) for f in fields(find_class(tree, cls, frontend))}

    kv_path = "vllm/config/kv_transfer.py"
    kv_fields = [
        field_name(f) for f in fields(find_class(src.tree(kv_path), "KVTransferConfig", kv_path))
    ]

    factory = src.tree("vllm/distributed/kv_transfer/kv_connector/factory.py")
    connectors = sorted(
        call.args[0].value
        for call in calls(factory)
        if name_of(call.func) == "register_connector"
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    )
    return {
        "version": VLLM_VERSION,
        "serve_flags": sorted(flags),
        "choices": {"--kv-cache-dtype": _literal_alias(src, "vllm/config/cache.py", "CacheDType")},
        "kv_transfer_config_fields": kv_fields,
        "kv_connectors": connectors,
        "metrics": _vllm_metrics(src),
        "histogram_buckets": _vllm_buckets(src),
        "nixl_tp": _tp_rule(src, "vllm/distributed/kv_transfer/kv_connector/utils.py", "tp_ratio"),
        "mooncake_tp": _tp_rule(
            src,
            "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py",
            "_get_tp_ratio",
        ),
    }


def _literal_alias(src: Source, path: str, name: str) -> list[str]:
    """The values of a module-level `Name = Literal[...]`."""
    for node in src.tree(path).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
            and isinstance(node.value, ast.Subscript)
            and name_of(node.value.value) == "Literal"
        ):
            return [str(ast.literal_eval(v)) for v in subscript_items(node.value)]
    raise FactError(f"{path}: {name} = Literal[...] is gone")


def _vllm_metrics(src: Source) -> dict[str, dict[str, str | None]]:
    """Engine metrics (v1/metrics/loggers.py) and the NIXL connector's, with the bucket
    family each histogram takes (None: buckets of its own, not one of the families)."""
    loggers = "vllm/v1/metrics/loggers.py"
    metrics = _vllm_metrics_of(loggers, src.tree(loggers))
    for path, tree in src.under("vllm/distributed/kv_transfer/kv_connector/v1/nixl/"):
        metrics |= _vllm_metrics_of(path, tree, required=False)
    return dict(sorted(metrics.items()))


def _vllm_metrics_of(
    path: str, tree: ast.Module, required: bool = True
) -> dict[str, dict[str, str | None]]:
    family_of: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and name_of(node.value.func) == "histogram_buckets"
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value.args[0], ast.Constant)
        ):
            family_of[node.targets[0].id] = str(node.value.args[0].value)
    metrics: dict[str, dict[str, str | None]] = {}
    for call in calls(tree):
        kind = _VLLM_METRIC_KINDS.get(name_of(call.func))
        name = keyword(call, "name")
        if kind is None or not isinstance(name, ast.Constant):
            continue
        buckets = keyword(call, "buckets")
        family = family_of.get(buckets.id) if isinstance(buckets, ast.Name) else None
        metrics[str(name.value)] = {"type": kind, "buckets": family}
    if required and not metrics:
        raise FactError(f"{path}: no metric is created through _gauge/_counter/_histogram_cls")
    return metrics


def _vllm_buckets(src: Source) -> dict[str, list[float]]:
    path = "vllm/v1/metrics/buckets.py"
    tree = src.tree(path)
    constants = module_literals(tree)
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "_STATIC_FAMILY_DEFAULTS":
                return {
                    str(ast.literal_eval(key)): [float(v) for v in constants[value.id]]
                    for key, value in zip(node.value.keys, node.value.values, strict=True)
                    if key is not None and isinstance(value, ast.Name)
                }
    raise FactError(f"{path}: _STATIC_FAMILY_DEFAULTS is gone")


def _tp_rule(src: Source, path: str, function: str) -> dict[str, Any]:
    """What a connector's TP-ratio function asserts about the local and remote TP sizes:
    `either_direction_if_multiple` when it asserts divisibility both ways (so any pair
    whose larger size is a multiple of the smaller is accepted, and no other)."""
    for node in ast.walk(src.tree(path)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            divisions = sorted(
                ast.unparse(assertion.test)
                for assertion in ast.walk(node)
                if isinstance(assertion, ast.Assert)
                and isinstance(assertion.test, ast.Compare)
                and isinstance(assertion.test.left, ast.BinOp)
                and isinstance(assertion.test.left.op, ast.Mod)
            )
            dividends = {d.split(" % ")[0] for d in divisions}
            return {
                "source": f"{path}:{function}",
                "asserts": divisions,
                "either_direction_if_multiple": len(divisions) == 2 and len(dividends) == 2,
            }
    raise FactError(f"{path}: {function} is gone")


# --- SGLang ---------------------------------------------------------------------------


def sglang_facts(src: Source) -> dict[str, Any]:
    choices_path = "sglang/srt/arg_groups/choices.py"
    named_choices = module_literals(src.tree(choices_path))
    flags: set[str] = option_literals(src.tree("sglang/srt/server_args.py"))
    choices: dict[str, list[str]] = {}
    for _, tree in src.under("sglang/srt/arg_groups/fields/"):
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for field in fields(cls):
                names, options = _sglang_field(field, named_choices)
                flags |= set(names)
                if options:
                    choices[names[0]] = options
    metrics_path = "sglang/srt/observability/metrics_collector.py"
    metrics = sorted(
        {
            str(name.value)
            for call in calls(src.tree(metrics_path))
            if isinstance(name := keyword(call, "name"), ast.Constant)
            and str(name.value).startswith("sglang:")
        }
    )
    return {
        "version": SGLANG_VERSION,
        "server_flags": sorted(flags),
        "choices": dict(sorted(choices.items())),
        "metrics": metrics,
        "histogram_buckets": _sglang_buckets(src.tree(metrics_path), metrics_path),
        "observed_stages": _sglang_observed_stages(src),
        "mooncake_tp_guards": _mooncake_tp_guards(src),
    }


def _sglang_observed_stages(src: Source) -> dict[str, str]:
    """The request stages SGLang times in ``sglang:per_stage_req_latency_seconds``: each
    ``RequestStage`` attribute built with ``metrics_is_observed=True``, by attribute, with the
    ``stage`` label value it gets."""
    path = "sglang/srt/observability/req_time_stats.py"
    classes = [n for n in ast.walk(src.tree(path)) if isinstance(n, ast.ClassDef)]
    stage_class = next((c for c in classes if c.name == "RequestStage"), None)
    if stage_class is None:
        raise FactError(f"{path}: class RequestStage is gone")
    stages: dict[str, str] = {}
    for node in stage_class.body:
        if not (
            isinstance(node, ast.Assign)
            and isinstance(target := node.targets[0], ast.Name)
            and isinstance(call := node.value, ast.Call)
            and name_of(call.func) == "RequestStageConfig"
            and call.args
            and isinstance(call.args[0], ast.Constant)
        ):
            continue
        observed = keyword(call, "metrics_is_observed")
        if isinstance(observed, ast.Constant) and observed.value is True:
            stages[target.id] = str(call.args[0].value)
    if not stages:
        raise FactError(f"{path}: no RequestStage is observed in metrics")
    return dict(sorted(stages.items()))


SGLANG_BUCKET_DEFAULTS: Final = ("bucket_time_to_first_token", "bucket_inter_token_latency")


def _sglang_buckets(tree: ast.Module, path: str) -> dict[str, list[float]]:
    """The default bounds of SGLang's latency histograms: the list each ``bucket_*`` argument
    of the collector takes when it is None (``--bucket-*`` server flags replace them)."""
    found: dict[str, list[float]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(target := node.targets[0], ast.Name)
            and target.id in SGLANG_BUCKET_DEFAULTS
            and isinstance(node.value, ast.List)
        ):
            found[target.id.removeprefix("bucket_")] = [
                float(v) for v in ast.literal_eval(node.value)
            ]
    missing = [name for name in SGLANG_BUCKET_DEFAULTS if name.removeprefix("bucket_") not in found]
    if missing:
        raise FactError(f"{path}: no default list for {', '.join(missing)}")
    return dict(sorted(found.items()))


def _sglang_field(
    field: ast.AnnAssign, named_choices: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The flags of one `name: A[T, help-or-Arg(...)]` field and its choices, if literal."""
    annotation = field.annotation
    if not (isinstance(annotation, ast.Subscript) and name_of(annotation.value) == "A"):
        return [], []
    parts = subscript_items(annotation)
    names = [flag(field_name(field))]
    options: list[str] = []
    kind = parts[0]
    if isinstance(kind, ast.Subscript) and name_of(kind.value) == "Literal":
        options = [str(ast.literal_eval(v)) for v in subscript_items(kind)]
    meta = parts[1] if len(parts) > 1 else None
    if isinstance(meta, ast.Call) and name_of(meta.func) == "Arg":
        cli_name = keyword(meta, "cli_name")
        if isinstance(cli_name, ast.Constant):
            names = [str(cli_name.value)]
        aliases = keyword(meta, "aliases")
        if isinstance(aliases, ast.List):
            names += [str(ast.literal_eval(a)) for a in aliases.elts]
        listed = keyword(meta, "choices")
        if isinstance(listed, ast.Name) and isinstance(named_choices.get(listed.id), list):
            options = [str(v) for v in named_choices[listed.id]]
        elif isinstance(listed, ast.List | ast.Tuple):
            options = [str(ast.literal_eval(v)) for v in listed.elts]
    return names, options


def _mooncake_tp_guards(src: Source) -> list[dict[str, str]]:
    """Every place the Mooncake connection refuses a peer over TP sizes: the function, the
    condition it refuses under, and its message."""
    path = "sglang/srt/disaggregation/mooncake/conn.py"
    guards: list[dict[str, str]] = []
    for function in ast.walk(src.tree(path)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for branch in (n for n in ast.walk(function) if isinstance(n, ast.If)):
            for statement in branch.body:
                refusal = _refusal_text(statement)
                if refusal and "TP" in refusal:
                    guards.append(
                        {
                            "function": function.name,
                            "when": ast.unparse(branch.test),
                            "message": refusal,
                        }
                    )
    return guards


def _refusal_text(statement: ast.stmt) -> str:
    """The literal text of `raise E(msg)` or `return False, msg`, else ''."""
    if isinstance(statement, ast.Raise) and isinstance(statement.exc, ast.Call):
        message = statement.exc.args[0] if statement.exc.args else None
    elif (
        isinstance(statement, ast.Return)
        and isinstance(statement.value, ast.Tuple)
        and len(statement.value.elts) == 2
        and isinstance(statement.value.elts[0], ast.Constant)
        and statement.value.elts[0].value is False
    ):
        message = statement.value.elts[1]
    else:
        return ""
    if message is None:
        return ""
    return "".join(
        str(n.value)
        for n in ast.walk(message)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


# --- the file -------------------------------------------------------------------------


def generate() -> str:
    facts = {
        "generated_by": "upstream/facts.py (make facts): DO NOT EDIT",
        "vllm": vllm_facts(Source(fetch("vllm", VLLM_VERSION), "vllm")),
        "sglang": sglang_facts(Source(fetch("sglang", SGLANG_VERSION), "sglang")),
    }
    return json.dumps(facts, indent=1, sort_keys=False) + "\n"


def _changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        where = f"{prefix}{key}"
        if key not in new:
            lines.append(f"gone: {where}")
        elif key not in old:
            lines.append(f"new: {where}")
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            lines += _changes(old[key], new[key], f"{where}.")
        elif isinstance(old[key], list) and isinstance(new[key], list) and old[key] != new[key]:
            gone = [v for v in old[key] if v not in new[key]]
            added = [v for v in new[key] if v not in old[key]]
            lines.append(f"changed: {where}: gone {gone[:10]}, new {added[:10]}")
        elif old[key] != new[key]:
            lines.append(f"changed: {where}: {old[key]!r} -> {new[key]!r}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if facts.json is stale")
    args = parser.parse_args()
    try:
        text = generate()
    except (FactError, OSError) as error:
        print(f"upstream facts: {error}", file=sys.stderr)
        return 1
    if args.check:
        committed = FACTS.read_text() if FACTS.exists() else "{}"
        changes = _changes(json.loads(committed), json.loads(text))
        if changes:
            print("upstream/facts.json is stale (run `make facts`):", file=sys.stderr)
            print("\n".join(f"  {line}" for line in changes), file=sys.stderr)
            return 1
        print("upstream/facts.json matches the pinned vLLM and SGLang sources")
        return 0
    FACTS.write_text(text)
    print(f"wrote {FACTS.relative_to(ROOT)} from vllm {VLLM_VERSION} and sglang {SGLANG_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
