"""Cross-field rules, stated once and enforced twice.

Each :class:`Rule` carries a CEL expression (emitted into the CRD as
``x-kubernetes-validations``, so the API server rejects a bad manifest) and a Python predicate
(run by the pydantic models, so ``disagg validate`` and the operator reject it with the same
message before anything reaches a cluster). A test evaluates both on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from pydantic import BaseModel, model_validator
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Rule:
    """One validation rule of a model, in CEL for the API server and in Python for us."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None
    """Where the error points, relative to the model (e.g. ``.decode.tensorParallelSize``)."""

    def to_schema(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry of this rule."""
        entry = {"rule": self.cel, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry


RENAMED: Final = "Renamed"
"""How the description of a field kept only to refuse its old spelling begins."""


def renamed(old: str, new: str, value: Callable[[Any], Any]) -> Rule:
    """The rule that refuses a field's old spelling, saying where it went. The field stays in
    the schema: dropped, the API server would prune a stored model's value of it on read and
    the operator would silently serve defaults in its place."""
    return Rule(
        cel=f"!has(self.{old})",
        message=f"{old} was renamed {new}: move it there (the API is v1alpha1; nothing else "
        "about it changed)",
        check=lambda model: value(model) is None,
        field_path=f".{old}",
    )


class RuleChecked(BaseModel):
    """Mixin: run the class's ``rules`` after field validation and export them as CEL."""

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> RuleChecked:
        for rule in type(self).rules:
            if not rule.check(self):
                raise PydanticCustomError(
                    "rule",
                    "{message}",
                    {
                        "message": rule.message,
                        "field_path": rule.field_path or "",
                        "rule": rule.cel,
                    },
                )
        return self


def add_rules_to_schema(schema: dict[str, Any], cls: type[Any]) -> None:
    """pydantic ``json_schema_extra`` hook: attach the class's rules as CEL validations."""
    rules: tuple[Rule, ...] = getattr(cls, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_schema() for rule in rules]
