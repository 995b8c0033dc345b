"""``disagg-engine``: the engine image's entrypoint (``launch``) and preStop hook (``drain``).

The same actions are ``disagg engine launch`` and ``disagg engine drain`` where the whole
project is installed; this console script is what the engine images carry.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from disagg_engine import drain, launcher


def add_actions(parser: argparse.ArgumentParser) -> None:
    """Add the engine actions (``launch``, ``drain``) to ``parser``."""
    actions = parser.add_subparsers(dest="engine_command", required=True, metavar="ACTION")
    launcher.register(actions)
    drain.register(actions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="disagg-engine",
        description="The engine pod's launcher and preStop drain (standard library only).",
    )
    add_actions(parser)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
