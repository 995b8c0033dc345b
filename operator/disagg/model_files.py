"""DisaggregatedModel manifests read from a file or stdin for the commands (``disagg render``,
``validate``, ``diagnose -f``), and the one error type every command prints as is."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from disagg.api.resource import DisaggregatedModel, ManifestError, parse_manifest
from disagg.yamlio import YamlLimitError, load_all


class CliError(Exception):
    """A user-facing failure: printed as is, exit code 1."""


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise CliError(f"{path}: no such file") from error
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise CliError(f"{path}: cannot read: {error}") from error


def load_models(path: str, notes: list[str] | None = None) -> list[DisaggregatedModel]:
    """Every DisaggregatedModel in a YAML file, or a CliError naming each problem; where
    ``kubectl apply --server-side`` would judge a model otherwise, a line goes to ``notes``."""
    text = _read_text(path)
    try:
        documents = load_all(text)
    except YamlLimitError as error:
        raise CliError(f"{path}: refused: {error}") from error
    except yaml.YAMLError as error:
        raise CliError(f"{path}: not valid YAML: {error}") from error
    if not documents:
        raise CliError(f"{path}: no YAML documents found")
    models, problems = [], []
    for index, document in enumerate(documents):
        label = f"{path}" if len(documents) == 1 else f"{path} (document {index + 1})"
        said: list[str] = []
        try:
            models.append(parse_manifest(document, said))
        except ManifestError as error:
            problems += [f"{label}: {line}" for line in error.problems]
        if notes is not None:
            notes += [f"{label}: {line}" for line in said]
    if problems:
        raise CliError("\n".join(problems))
    return models
