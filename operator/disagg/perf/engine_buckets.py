"""Which latency buckets an engine exports, from its command line: the engine's defaults,
or the bounds a user set through ``extraArgs`` (vLLM's ``--custom-histogram-buckets``,
SGLang's ``--bucket-time-to-first-token`` and ``--bucket-inter-token-latency``).

The autoscaler reads what a p99 says for certain from the bounds of the bucket it falls in,
so it must know the bounds the engine really uses. The arguments are read as the engines'
parsers read them (checked in vLLM 0.33's ``utils/argparse_utils.py`` and
``config/observability.py``, SGLang 0.5.23's ``arg_groups``), and bounds the engine would
refuse at start-up are refused here first, with what is wrong and where.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Final, Literal

from disagg.perf.buckets import LATENCY_BUCKETS

Phase = Literal["prefill", "decode"]

VLLM_FLAG: Final = "--custom-histogram-buckets"
VLLM_FAMILIES: Final = frozenset({
    "request_latency", "time_to_first_token", "inter_token_latency", "iteration_tokens",
    "request_params_n", "request_num_preemptions", "request_tokens", "kv_cache_residency",
})  # fmt: skip
"""The bucket families vLLM 0.33 takes (``BUCKET_FAMILY_KEYS``); any other is an error."""
VLLM_PHASE_FAMILY: Final[dict[Phase, str]] = {
    "prefill": "time_to_first_token",
    "decode": "inter_token_latency",
}
SGLANG_PHASE_FLAG: Final[dict[Phase, str]] = {
    "prefill": "--bucket-time-to-first-token",
    "decode": "--bucket-inter-token-latency",
}


def latency_buckets(backend: str, args: Sequence[str]) -> dict[Phase, tuple[float, ...]]:
    """The bounds of the TTFT (prefill) and inter-token (decode) histograms an engine
    started with ``args`` exports; ValueError says why the engine would refuse them."""
    defaults: dict[Phase, tuple[float, ...]] = {
        "prefill": LATENCY_BUCKETS[backend]["prefill"],
        "decode": LATENCY_BUCKETS[backend]["decode"],
    }
    if backend == "vllm":
        custom = vllm_custom_buckets(args)
        return {
            phase: custom.get(family, defaults[phase])
            for phase, family in VLLM_PHASE_FAMILY.items()
        }
    result = dict(defaults)
    for arg in args:
        if arg.startswith("--"):
            _refuse_abbreviation(arg.split("=", 1)[0], tuple(SGLANG_PHASE_FLAG.values()))
    for phase, flag in SGLANG_PHASE_FLAG.items():
        values = _sglang_list(args, flag)
        if values is not None:
            result[phase] = _bounds(flag, values)
    return result


def _refuse_abbreviation(name: str, flags: tuple[str, ...]) -> None:
    """argparse takes a unique prefix of a flag for the flag; no engine flag is a prefix of
    these (a test holds that to the pinned releases), so such a name can only be one."""
    for flag in flags:
        if len(name) > 2 and name != flag and flag.startswith(name):
            raise ValueError(f"{name} abbreviates {flag}: spell it in full")


def _vllm_name(arg: str) -> str:
    """vLLM's parser spells ``_`` as ``-`` in an option's name, up to its first dot."""
    name = arg.split("=", 1)[0]
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def vllm_custom_buckets(args: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """The last ``--custom-histogram-buckets JSON`` wins, as in argparse, unless dotted
    keys (``--custom-histogram-buckets.time_to_first_token '[...]'``) are given: vLLM merges
    those into one value it appends after every other argument."""
    plain: str | None = None
    dotted: dict[str, object] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        name = _vllm_name(arg) if arg.startswith("--") else ""
        _refuse_abbreviation(name.partition(".")[0], (VLLM_FLAG,))
        inline = arg.split("=", 1)[1] if "=" in arg else None
        if name == VLLM_FLAG or name.startswith(VLLM_FLAG + "."):
            if inline is None:
                if index + 1 >= len(args):
                    raise ValueError(f"{VLLM_FLAG} is missing its value")
                index += 1
                inline = args[index]
            if name == VLLM_FLAG:
                plain = inline
            else:
                family = name.removeprefix(VLLM_FLAG + ".")
                parsed: object
                if family.endswith("+"):  # vLLM's comma-separated list form
                    family, parsed = family[:-1], inline.split(",")
                else:
                    parsed = _json(f"{VLLM_FLAG}.{family}", inline)
                previous = dotted.get(family)
                if isinstance(previous, list) and isinstance(parsed, list):
                    parsed = previous + parsed  # vLLM merges repeated lists
                dotted[family] = parsed
        index += 1
    if dotted:
        value: object = dotted
    elif plain is not None:
        value = _json(VLLM_FLAG, plain)
    else:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{VLLM_FLAG} must map a bucket family to a list of bounds")
    custom: dict[str, tuple[float, ...]] = {}
    for family, bounds in value.items():
        where = f"{VLLM_FLAG}[{family!r}]"
        if family not in VLLM_FAMILIES:
            raise ValueError(
                f"{VLLM_FLAG}: unknown bucket family {family!r}; vLLM knows "
                + ", ".join(sorted(VLLM_FAMILIES))
            )
        if not isinstance(bounds, list):
            raise ValueError(f"{where} must be a list of bounds")
        custom[family] = _bounds(where, bounds)
    return custom


def _json(where: str, text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as error:
        raise ValueError(f"{where}: {text!r} is not JSON ({error})") from None


def _sglang_list(args: Sequence[str], flag: str) -> list[object] | None:
    """The values of SGLang's last ``flag v1 v2 ...`` (argparse ``nargs="+"``)."""
    found: list[object] | None = None
    for index, arg in enumerate(args):
        if arg.startswith(flag + "="):
            found = [arg.split("=", 1)[1]]
        elif arg == flag:
            found = []
            for value in args[index + 1 :]:
                if value.startswith("-") and not _is_number(value):
                    break
                found.append(value)
            if not found:
                raise ValueError(f"{flag} is missing its bounds")
    return found


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _bounds(where: str, values: Sequence[object]) -> tuple[float, ...]:
    """Strictly increasing, finite, positive numbers, as vLLM demands of custom buckets
    (the Prometheus client SGLang uses refuses unsorted ones, and a bound of zero or a
    repeated one would give ``histogram_quantile`` nothing to interpolate)."""
    if not values:
        raise ValueError(f"{where} must not be empty")
    bounds: list[float] = []
    for value in values:
        number = _number(value)
        if number is None or not math.isfinite(number) or number <= 0:
            raise ValueError(f"{where}: bound {value!r} must be a finite number greater than 0")
        if bounds and number <= bounds[-1]:
            raise ValueError(
                f"{where}: bounds must be strictly increasing ({bounds[-1]:g} then {number:g})"
            )
        bounds.append(number)
    return tuple(bounds)


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and _is_number(value):
        return float(value)
    return None
