"""Which optional extras a command needs, and one clear refusal when they are missing.

The operator and the router install without plotting or terminal-UI libraries; the demo and
the simulators' plots need the ``tools`` extra (matplotlib, rich).
"""

from __future__ import annotations

import importlib.util
from typing import Final

TOOLS: Final = ("matplotlib", "rich")


def require_tools(feature: str, modules: tuple[str, ...] = TOOLS) -> None:
    """Exit with one line naming the extra to install when ``modules`` are not importable."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"error: {feature} needs {' and '.join(missing)}: pip install 'disagg-operator[tools]'"
        )
