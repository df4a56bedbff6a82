"""``torch-adapter export``: a model factory → a ``.pt2`` program lowered to a target.

    torch-adapter export --model my_models:build --target mps --output model.pt2

``--model`` names a factory ``module:function`` (or ``path/to/file.py:function``) returning
``(model, example_inputs)`` — the same factories ``torch-adapter coverage --models`` takes.
Writes ``model.pt2`` and ``model.routing.json`` (ops decomposed, ops that would still fall
back), both through the one safe writer (``_safe_io``; checked before the model is built; the
folder must exist). Exit codes: 0 written, 1 some ops would still fall back on the target
(``--fail-on-fallback``), 2 usage or I/O errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="export a model lowered to a target's native ops (.pt2)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                   help="a factory returning (model, example_inputs)")
    p.add_argument("--target", default=None, help="target name or profile .toml (default: this machine's)")
    p.add_argument("--output", required=True, metavar="PATH.pt2", help="where to write the program")
    p.add_argument("--json", action="store_true", help="print the routing report as JSON")
    p.add_argument("--fail-on-fallback", action="store_true", help="exit 1 if any op would fall back")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..coverage.factories import build, load_factory
    from ..errors import AdapterError
    from ..tools.exporting import export

    try:
        from pathlib import Path

        from ..core.safe_io import check_output

        if args.output.endswith(".pt2"):  # (a wrong suffix is export()'s error, with its fix)
            check_output(args.output, call="torch-adapter export --output")
            check_output(str(Path(args.output).with_suffix(".routing.json")),
                         call="torch-adapter export --output (its .routing.json)")
        work = build(load_factory(args.model))
        inputs = work.inputs if isinstance(work.inputs, tuple) else (work.inputs,)
        if isinstance(work.inputs, dict):
            result = export(work.model, (), kwargs=work.inputs, target=args.target, path=args.output)
        else:
            result = export(work.model, inputs, target=args.target, path=args.output)
    except (AdapterError, OSError) as exc:
        print(f"torch-adapter export: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(f"wrote {result.path} and {result.report_path}")
        print(f"{result!r}")
        for fb in result.fallbacks:
            print(f"  would fall back: {fb['op']} ({fb.get('reason', '')})")
    return 1 if (args.fail_on_fallback and result.fallbacks) else 0
