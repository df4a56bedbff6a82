"""``torch-adapter coverage``: op coverage of one training step per model family × target.

``register(subparsers)`` adds the sub-command to ``torch-adapter``; ``python -m
torch_adapter.coverage`` runs it on its own (:func:`main`). Exit codes:

* 0 -- every model × target measured (fallbacks are findings, not failures);
* 1 -- a training step failed on some target (its row says why);
* 2 -- usage or I/O errors (unknown target or model, bad factory, unwritable output).

``--json``, ``--html`` and ``--markdown`` files are written by the one safe writer
(``_safe_io``: atomic, devices/FIFOs/folders/symbolic links refused, the folder must exist);
the paths are checked before anything is measured.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..errors import AdapterError, UsageError, format_error

__all__ = ["register", "run", "main", "build_parser", "write_atomic", "EXIT_OK", "EXIT_STEP_FAILED", "EXIT_ERROR"]

EXIT_OK, EXIT_STEP_FAILED, EXIT_ERROR = 0, 1, 2
_HELP = "measure which ops of a training step run native / composite / CPU fallback, per model × target"
_EPILOG = ("Coverage says where ops would run on the target; it is not the target's speed (simulated targets "
           "execute on this machine). Exit codes: 0 measured, 1 a step failed on a target, 2 usage or I/O errors.")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", default="cuda,mps,npu,xpu,mtia", metavar="T[,T...]",
                   help="comma-separated: simulated profiles (cuda, mps, npu, xpu, mtia, cpu), host (this machine's "
                        "real target) or PROFILE.toml files (default: cuda,mps,npu,xpu,mtia)")
    p.add_argument("--models", default=None, metavar="M[,M...]",
                   help="comma-separated built-in families (resnet, bert, gpt2, sd_unet, sd_vae, clip_text, lstm, "
                        "custom_op; default: all) and/or module:factory or path/to/file.py:factory, where "
                        "factory() returns (model, example_inputs[, loss_fn])")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON (schema torch-adapter.coverage v1)")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with a chart")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown page (how docs/coverage.md is made)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="fallback ops listed per row (default 5)")
    p.add_argument("--reasons", action="store_true", help="show each fallback's reason in the terminal table")
    p.add_argument("--list-models", action="store_true", help="list the built-in model families and exit")
    p.add_argument("--quiet", "-q", action="store_true", help="no terminal table or progress")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``coverage`` to a ``torch-adapter`` sub-parsers object."""
    p = subparsers.add_parser("coverage", help=_HELP, description=_HELP + ".", epilog=_EPILOG)
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torch-adapter coverage", description=_HELP + ".", epilog=_EPILOG)
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` with the one safe writer (:mod:`torch_adapter.core.safe_io`)."""
    from ..core.safe_io import write_text

    write_text(path, text, call=f"torch-adapter coverage: writing {path}")


def _check_output(option: str, path: str | None) -> None:
    if path is not None:
        from ..core.safe_io import check_output

        check_output(path, call=f"torch-adapter coverage {option}")


def _list_models() -> int:
    from .models import FAMILIES

    for fam in FAMILIES:
        print(f"{fam.name:<10} {fam.kind:<12} {fam.description}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Run ``coverage`` for parsed ``args``; returns the exit code."""
    if getattr(args, "list_models", False):
        return _list_models()
    try:
        return _coverage(args)
    except AdapterError as exc:
        print(f"torch-adapter coverage: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _coverage(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .engine import measure, parse_targets
    from .factories import resolve_models

    for option in ("json", "html", "markdown"):
        _check_output(f"--{option}", getattr(args, option, None))
    if args.top < 0:
        raise UsageError(format_error("torch-adapter coverage --top", "a number >= 0", str(args.top), fix="e.g. --top 5"))
    if os.getcwd() not in sys.path:  # module:factory from the working directory, as with `python -m`
        sys.path.insert(0, os.getcwd())
    targets = parse_targets(args.targets)  # fail fast on a bad target or model, before measuring
    families = resolve_models(args.models)
    err = Console(stderr=True, highlight=False)
    status = err.status("measuring…") if not args.quiet and err.is_terminal else None

    def progress(model: str, target: str) -> None:
        if status is not None:
            status.update(f"measuring {model} on {target}…")

    if status is not None:
        status.start()
    try:
        report = measure(models=families, targets=[t.spec for t in targets], top=args.top, progress=progress)
    finally:
        if status is not None:
            status.stop()
    if not args.quiet:
        from rich.text import Text

        from .render import fallback_lines, rich_table

        out = Console(highlight=False)
        wide = out.width >= 130
        out.print(rich_table(report, reasons=args.reasons, fallbacks=wide))
        if not wide:
            for line in fallback_lines(report, reasons=args.reasons):
                out.print(Text(line))
    _write_outputs(args, report, err)
    return EXIT_STEP_FAILED if report.errors else EXIT_OK


def _write_outputs(args: argparse.Namespace, report: Any, err: Any) -> None:
    outputs = []
    if args.json:
        from .render import render_json

        outputs.append((args.json, render_json(report)))
    if args.html:
        from .html_page import render_html

        outputs.append((args.html, render_html(report)))
    if args.markdown:
        from ._docs import coverage_page

        outputs.append((args.markdown, coverage_page(report)))
    for path, text in outputs:
        write_atomic(path, text)
        if not args.quiet:
            err.print(f"written: {path}")


def main(argv: list[str] | None = None) -> int:
    """``python -m torch_adapter.coverage [options]``."""
    from ..core.command import guarded

    args = build_parser().parse_args(argv)
    args.command = "coverage"
    return guarded(args.func, args)
