"""The ``disagg`` command line: render, validate, crds, and the long-running components.

Every failure the user can cause (a missing file, bad YAML, an invalid manifest, a bad flag)
ends with a one-line-per-problem message on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from disagg import __version__
from disagg.api.crd import CRD_FILE_NAME, CRD_HEADER, build_crd
from disagg.api.reference import reference_markdown
from disagg.demo.run import register as register_demo
from disagg.devcluster.cli import register as register_dev
from disagg.diagnose.cli import register as register_diagnose
from disagg.model_files import CliError, load_models
from disagg.plan.cli import register as register_plan
from disagg.reconcile.run import register_cli as register_run
from disagg.render import RenderContext, render_all
from disagg.router.cli import register as register_router
from disagg.sim.cli import register as register_sim
from disagg.sim.simulate import register as register_simulate
from disagg.versions import add_image_flags, images_from_args
from disagg.yamlio import dump, dump_all
from disagg_engine.cli import add_actions as add_engine_actions


def cmd_render(args: argparse.Namespace) -> int:
    try:
        images = images_from_args(args)
    except ValueError as error:
        raise CliError(str(error)) from None
    models = load_models(args.file)
    objects = [obj for model in models for obj in render_all(RenderContext(model, images=images))]
    sys.stdout.write(dump_all(objects))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    notes: list[str] = []
    models = load_models(args.file, notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for model in models:
        print(f"{args.file}: {model.metadata.namespace}/{model.metadata.name}: valid")
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    if args.reference:
        Path(args.reference).write_text(reference_markdown(), encoding="utf-8")
        print(f"wrote {args.reference}")
    text = CRD_HEADER + dump(build_crd())
    if args.output_dir is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CRD_FILE_NAME).write_text(text, encoding="utf-8")
    print(f"wrote {out / CRD_FILE_NAME}")
    return 0


def _add_file_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--file", required=True, help="manifest with DisaggregatedModel(s), or - for stdin"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="disagg", description="Prefill/decode disaggregated LLM serving on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"disagg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = sub.add_parser("render", help="print the Kubernetes objects a model becomes")
    _add_file_arg(render)
    add_image_flags(render)
    render.set_defaults(func=cmd_render)

    validate = sub.add_parser("validate", help="check manifests against the API and its rules")
    _add_file_arg(validate)
    validate.set_defaults(func=cmd_validate)

    crds = sub.add_parser("crds", help="print (or write) the generated CRD")
    crds.add_argument("--output-dir", help="write <dir>/" + CRD_FILE_NAME + " instead of stdout")
    crds.add_argument("--reference", help="also write the API reference (markdown) to this file")
    crds.set_defaults(func=cmd_crds)

    register_dev(sub)
    register_run(sub)
    register_sim(sub)
    register_plan(sub)
    register_diagnose(sub)
    register_simulate(sub)
    register_router(sub)
    engine = sub.add_parser("engine", help="engine-side tools (also the disagg-engine command)")
    add_engine_actions(engine)
    register_demo(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``disagg`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
