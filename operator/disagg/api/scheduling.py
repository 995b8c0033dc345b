"""Where a pool's pods may run, and the Kubernetes name syntaxes: tolerations, label keys and
values, DNS subdomains and labels, validated as the API server validates them (Kubernetes
v1.35.4, ``pkg/apis/core/validation``: ValidateTolerations, IsQualifiedName,
IsValidLabelValue, NameIsDNSSubdomain, IsDNS1123Label), so a model this accepts renders
objects the API server accepts too.

Patterns are OpenAPI ``pattern``s (checked by the API server natively, and by pydantic the
same way); what spans fields is a :class:`~disagg.api.rules.Rule`.
"""

from __future__ import annotations

import re
from typing import ClassVar, Final, Literal

from pydantic import Field

from disagg.api.base import ApiModel
from disagg.api.rules import Rule

_DNS_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN: Final = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_NAME: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED_NAME: Final = rf"^(({_DNS_SUBDOMAIN}/)?{_NAME})?$"
"""A label key (an optional DNS-subdomain prefix and ``/``, then a name of at most 63), or
empty."""
LABEL_VALUE: Final = rf"^({_NAME})?$"
DNS_SUBDOMAIN: Final = rf"^{_DNS_SUBDOMAIN}$"
DNS_LABEL: Final = rf"^{_DNS_LABEL}$"
"""A DNS-1123 label (a namespace name)."""
MAX_PREFIX: Final = 253
SCHEDULING_PATTERN_MEANINGS: Final = {
    QUALIFIED_NAME: "must be a label key: an optional DNS-subdomain prefix and '/', then at "
    "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
    LABEL_VALUE: "must be a label value: at most 63 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit (or empty)",
    DNS_SUBDOMAIN: "must be a DNS subdomain name: lowercase letters, digits, '-' and '.', "
    "starting and ending with a letter or digit",
    DNS_LABEL: "must be a namespace name: lowercase letters, digits and '-', starting and "
    "ending with a letter or digit",
}
"""What each pattern means, for error messages (the regular expression is not a message)."""


def prefix_fits(key: str | None) -> bool:
    """Whether a label key's prefix (before ``/``) is at most 253 characters."""
    return key is None or "/" not in key or key.index("/") <= MAX_PREFIX


def label_key_ok(key: str) -> bool:
    """Whether a string is a (non-empty) label key, as IsQualifiedName judges it."""
    return bool(key) and re.fullmatch(QUALIFIED_NAME, key) is not None and prefix_fits(key)


def label_keys_rule(field: str, attribute: str, message: str, lowered: bool = False) -> Rule:
    """A rule that every key of the map ``field`` (``attribute`` in Python) is a label key;
    ``lowered``: once lowercased, as the API server judges annotation keys."""
    key = "k.lowerAscii()" if lowered else "k"
    return Rule(
        cel=f"!has(self.{field}) || self.{field}.all(k, k != '' && "
        f"{key}.matches(r'{QUALIFIED_NAME}') && (!k.contains('/') || k.indexOf('/') <= 253))",
        message=message,
        check=lambda m: all(
            label_key_ok(k.lower() if lowered else k) for k in getattr(m, attribute)
        ),
        field_path=f".{field}",
    )


class Toleration(ApiModel):
    """A Kubernetes Toleration (operators Equal and Exists; Lt and Gt are behind a feature
    gate that is off by default)."""

    key: str | None = Field(
        default=None,
        max_length=317,
        pattern=QUALIFIED_NAME,
        description="Taint key to tolerate; empty with operator Exists tolerates every taint.",
    )
    operator: Literal["", "Equal", "Exists"] | None = Field(
        default=None, description="Equal (the default) or Exists."
    )
    value: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE,
        description="Taint value to match with operator Equal.",
    )
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        # The API server takes any int64; bounded where JSON numbers (and Helm) stay exact.
        ge=-(2**53),
        le=2**53,
        description="With effect NoExecute: how long the pod stays bound after the taint.",
    )

    rules: ClassVar = (
        Rule(
            cel="!has(self.key) || !self.key.contains('/') || self.key.indexOf('/') <= 253",
            message="tolerations: the prefix of key (before '/') must be at most 253 characters",
            check=lambda m: prefix_fits(m.key),
            field_path=".key",
        ),
        Rule(
            cel="(has(self.key) && self.key != '') || "
            "(has(self.operator) && self.operator == 'Exists')",
            message="tolerations: operator must be Exists when key is empty (it tolerates "
            "every taint)",
            check=lambda m: bool(m.key) or m.operator == "Exists",
            field_path=".operator",
        ),
        Rule(
            cel="!has(self.operator) || self.operator != 'Exists' || "
            "!has(self.value) || self.value == ''",
            message="tolerations: value must be empty when operator is Exists",
            check=lambda m: m.operator != "Exists" or not m.value,
            field_path=".value",
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerations: tolerationSeconds needs effect NoExecute",
            check=lambda m: m.toleration_seconds is None or m.effect == "NoExecute",
            field_path=".effect",
        ),
    )
