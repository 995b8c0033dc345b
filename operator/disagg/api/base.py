"""Shared building blocks of the API models: camelCase wire names, strict fields, units.

Every model forbids unknown fields, so a typo in a manifest is an error naming the field
instead of a silently ignored setting.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from disagg.api.rules import RuleChecked, add_rules_to_schema

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
"""ASCII digits only, as Go's (and so the API server's) pattern and duration parser read them."""
_UNIT_NANOSECONDS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_MAX_NANOSECONDS = 2**63 - 1
"""Go's time.Duration: CEL's duration() refuses anything longer (about 292 years)."""

QUANTITY_PATTERN = (
    r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE])?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_EXACT_DIGITS = 40
_DECIMAL = {
    "m": Fraction(1, 1000),
    **{k: Fraction(10**e) for k, e in zip("kMGTPE", range(3, 19, 3), strict=True)},
}


class ApiModel(RuleChecked):
    """Base of every API model: camelCase on the wire, unknown fields rejected, CEL rules."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,  # as the CRD's schema: no "8" for 8, no 1 for true
        json_schema_extra=add_rules_to_schema,
    )

    def to_wire(self) -> dict[str, Any]:
        """The model as it appears in a manifest (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as ``250ms``, ``2s`` or ``1m30s``."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as '250ms', '2s' or '1m30s'")
    # Whole nanoseconds, truncated, as Go parses it: CEL must see the same value.
    nanoseconds = sum(
        int(Decimal(n) * _UNIT_NANOSECONDS[unit]) for n, unit in _DURATION_PART.findall(text)
    )
    if nanoseconds > _MAX_NANOSECONDS:
        raise ValueError(f"{text!r} is longer than the longest duration (about 292 years)")
    return nanoseconds / 1e9


def format_duration(seconds: float) -> str:
    """A short human duration (``85ms``, ``1.2s``, ``3m``) for status and printer columns."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    return f"{seconds / 60:.3g}m"


def _check_duration(value: object) -> object:
    if isinstance(value, str):
        parse_duration(value)
    return value


def parse_quantity(text: str) -> float:
    """The value of a Kubernetes resource quantity (``16Gi``, ``500m``, ``2``)."""
    return float(exact_quantity(text))


def exact_quantity(quantity: str | int) -> Fraction:
    """The exact value of a quantity, where float rounding would judge differently from the
    API server (hugepage divisibility)."""
    if isinstance(quantity, int):
        return Fraction(quantity)
    if not _QUANTITY.fullmatch(quantity):
        raise ValueError(f"{quantity!r} is not a {QUANTITY_MEANING}")
    number, factor = quantity.lstrip("+"), Fraction(1)
    scales: dict[str, int | Fraction] = {**_BINARY, **_DECIMAL}
    for suffix, scale in scales.items():
        if number.endswith(suffix):
            number, factor = number[: -len(suffix)], Fraction(scale)
            break
    # An exponent such as 1e99999999 would make an exact number of a hundred million digits;
    # far beyond any int64 (or below a nano) the exact value decides nothing.
    magnitude = Decimal(number).adjusted()
    if magnitude > _EXACT_DIGITS:
        return Fraction(10 ** (_EXACT_DIGITS + 1)) * factor
    if magnitude < -_EXACT_DIGITS:
        return Fraction(0) if Decimal(number) == 0 else Fraction(1, 10**_EXACT_DIGITS) * factor
    return Fraction(number) * factor


def _check_quantity(value: object) -> object:
    if isinstance(value, str):
        if len(value) > QUANTITY_MAX_LENGTH:
            raise ValueError(
                f"must be a {QUANTITY_MEANING}, at most {QUANTITY_MAX_LENGTH} characters"
            )
        parse_quantity(value)
    elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"must be a {QUANTITY_MEANING}")  # an integer is an int64
    return value


Duration = Annotated[
    str,
    BeforeValidator(_check_duration),
    Field(
        max_length=32,
        json_schema_extra={
            "pattern": DURATION_PATTERN,
            # The pattern cannot bound the value; CEL's duration() refuses what Go cannot hold.
            "x-kubernetes-validations": [
                {
                    "rule": "duration(self) >= duration('0s')",
                    "message": "must be a duration no longer than about 292 years",
                }
            ],
        },
    ),
]
"""A Go-style duration string; stored as written, compared with :func:`parse_duration`."""

QUANTITY_MEANING = "non-negative Kubernetes quantity such as '16Gi', '500m' or 2"
QUANTITY_CEL = "type(self) != int || self >= 0"
"""A negative integer (a string's sign is the pattern's job)."""
QUANTITY_MAX_LENGTH = 64
"""Bounds what CEL rules comparing quantities may cost the API server."""

Quantity = Annotated[
    str | int,
    BeforeValidator(_check_quantity),
    Field(
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "maxLength": QUANTITY_MAX_LENGTH,
            "x-kubernetes-validations": [
                {"rule": QUANTITY_CEL, "message": f"must be a {QUANTITY_MEANING}"}
            ],
        }
    ),
]
"""A Kubernetes resource quantity, as a string or an integer."""
