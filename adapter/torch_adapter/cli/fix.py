"""``torch-adapter fix``: each fallback and refusal of a run, as a verified source patch (docs/cli.md#fix).

Exit codes: 0 every recorded fallback/refusal at a project line got a verified patch (printed; written
with ``--apply``), or there was none; 1 some did not (each named with why; the verified ones are still
printed or written); 2 a usage error — a bad flag, a script that is missing or fails before any change,
a foreign ``--from`` file, a write refused (nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser("fix", allow_abbrev=False,
                       help="turn the fallbacks and refusals a run recorded into verified source patches",
                       description="Run SCRIPT on the target (a fresh copy of the project), turn each CPU "
                                   "fallback and dtype refusal at a line of the project into a source edit "
                                   "(LibCST), re-run the changed copy to verify it (the fallback gone, the "
                                   "same results within tolerance) and print the patch as a unified diff; "
                                   "--apply writes it.")
    p.add_argument("--target", default="auto", help="auto (default), cpu, npu, mps, xpu, xpu-arc, or a profile .toml")
    p.add_argument("--simulate", action="store_true", help="preview TARGET's routing on this machine (dtype refusals recorded)")
    p.add_argument("--emulate", action="store_true", help="execute on the emulated TARGET (npu)")
    p.add_argument("--from", dest="from_json", metavar="ROUTING_JSON",
                   help="fix what this earlier run's --report-json recorded (sites relative to the working "
                        "directory it ran in); SCRIPT still runs, for the results to compare with")
    p.add_argument("--path", default=".", help="the project root: only files under it are edited (default: .)")
    p.add_argument("--apply", action="store_true", help="write the verified patches (atomically; nothing if any file fails its checks)")
    p.add_argument("--rtol", type=_number, default=1e-4, help="relative tolerance of the results (default 1e-4)")
    p.add_argument("--atol", type=_number, default=1e-6, help="absolute tolerance of the results (default 1e-6)")
    p.add_argument("--match", action="append", default=[], metavar="REGEX",
                   help="compare only the output lines matching REGEX (repeatable; default: every line)")
    p.add_argument("--ignore", action="append", default=[], metavar="REGEX",
                   help="leave the output lines matching REGEX out of the comparison (timings; repeatable)")
    p.add_argument("--compare-file", action="append", default=[], metavar="PATH",
                   help="a file the program writes (torch.save), relative to the working directory, compared too")
    p.add_argument("--timeout", type=_number, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of text")
    p.add_argument("script", metavar="SCRIPT", help="the program to run")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to SCRIPT")
    p.set_defaults(func=_fix)


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 2


def _fix(args: argparse.Namespace) -> int:
    import re

    from ..check.fix import records_of
    from ..check.fix_run import Options, relabel, apply, fix
    from ..errors import format_error
    from ..launch.runner import _script_problem

    call = "torch-adapter fix"
    root = Path(args.path).resolve()
    if not root.is_dir():
        return _fail(format_error(f"{call} --path", "a project folder", repr(args.path), why="no such folder"))
    problem = _script_problem(args.script)
    if problem is not None:
        return _fail(problem.replace("torch-adapter run", call))
    script = Path(args.script).resolve()
    if root not in script.parents:
        return _fail(format_error(call, f"a script inside the project {root}", str(script),
                                  why="the project is copied and run for each verification",
                                  fix="run fix from the project's folder, or give --path"))
    for pattern in args.match + args.ignore:
        try:
            re.compile(pattern)
        except re.error as exc:
            return _fail(format_error(f"{call} --match/--ignore", "a regular expression", repr(pattern), why=str(exc)))
    records = None
    if args.from_json:
        try:
            data = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return _fail(format_error(f"{call} --from", "a routing log (run --report-json)", repr(args.from_json),
                                      why=str(exc)))
        if not isinstance(data, dict) or data.get("schema") != "torch-adapter.routing-log":
            return _fail(format_error(f"{call} --from", "a routing log (schema torch-adapter.routing-log)",
                                      repr(args.from_json), why="it is another kind of file",
                                      fix="give the file `torch-adapter run --report-json FILE` wrote"))
        records = relabel(records_of(data), Path.cwd().resolve(), root)
    opts = Options(str(script), list(args.args), root, args.target, args.simulate, args.emulate, args.rtol,
                   args.atol, args.match, args.ignore, args.compare_file, args.timeout)
    result = fix(opts, records)
    written = apply(result.verified, root) if args.apply and result.verified else []
    if args.json:
        print(json.dumps(_as_json(result, written), indent=1))
    else:
        _print(result, written, args)
    return 0 if result.complete else 1


def _as_json(result: Any, written: list[Path]) -> dict[str, Any]:
    return {"schema": "torch-adapter.fix", "version": 1,
            "records": len(result.records),
            "verified": [{"file": e.label, "diff": e.diff(),
                          "changes": [{"line": c.line, "rule": c.rule, "before": c.before, "after": c.after,
                                       "ops": sorted({r.op for r in c.records})} for c in e.changes]}
                         for e in result.verified],
            "refused": [{"file": label, "line": c.line, "rule": c.rule, "after": c.after, "why": why}
                        for c, label, why in result.refused],
            "skipped": [{"file": s.record.file, "line": s.record.line, "op": s.record.op, "kind": s.record.kind,
                         "why": s.why} for s in result.skipped],
            "resolved": [{"file": s.record.file, "line": s.record.line, "op": s.record.op, "kind": s.record.kind}
                         for s in result.resolved],
            "written": [str(p) for p in written]}


def _print(result: Any, written: list[Path], args: argparse.Namespace) -> None:
    n = len(result.records)
    where = f"{args.target}{' (simulated)' if args.simulate else ' (emulated)' if args.emulate else ''}"
    print(f"torch-adapter fix: {n} fallback{'s' if n != 1 else ''}/refusal{'s' if n != 1 else ''} recorded "
          f"on {where}" + ("" if n else ": nothing to fix"))
    for e in result.verified:
        sys.stdout.write(e.diff())
    for e in result.verified:
        for c in e.changes:
            ops = ", ".join(sorted({r.op for r in c.records}))
            print(f"verified: {e.label}:{c.line}: {c.rule} ({ops} gone, results the same)")
    for c, label, why in result.refused:
        print(f"not fixed: {label}:{c.line}: {c.rule} — {why}")
    for s in result.resolved:
        print(f"gone too: {s.record.file}:{s.record.line}: {s.record.what} (no edit of its own: the verified "
              "changes removed it)")
    for s in result.skipped:
        print(f"not fixed: {s.text()}")
    if written:
        print("written: " + ", ".join(os.path.relpath(p) for p in written))
    elif result.verified:
        print("not written: add --apply to write the verified patches")
