"""The ``torch-adapter`` command (also ``python -m torch_adapter``).

Sub-commands: ``run``, ``targets``, and those other layers register (``check``, ...).
Exit codes: 0 success; 1 the script failed / findings at or above --fail-on; 2 usage or
I/O errors; a script's own exit code is passed through by ``run``.

One error path (:func:`main`): a torch_adapter error (bad input, an output that cannot be
written), a bad flag (argparse), a closed or full standard output and a broken pipe all end
as one message on stderr and exit 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from .._version import __version__
from ..core.command import EXIT_USAGE, guarded
from ..core.config import DTYPE_POLICIES, FLOAT16_COMPUTE, OPTIMIZATION_LEVELS

__all__ = ["main", "build_parser"]

# Modules that add a sub-command with `register(subparsers)`.
_PLUGINS = ("torch_adapter.check.cli", "torch_adapter.coverage.cli", "torch_adapter.cli.memory", "torch_adapter.cli.build",
            "torch_adapter.cli.export", "torch_adapter.cli.report", "torch_adapter.cli.fix")


def _add_run(sub: Any) -> None:
    # allow_abbrev=False: argparse matches abbreviations in every argument, the script's too, before
    # SCRIPT ends our options — the script's own `--dtype=float16` (nanoGPT) would be refused as
    # ambiguous (--dtype-policy, --dtype-check) or taken as ours; our options are spelled in full
    p = sub.add_parser("run", help="run a CUDA-written script on the target, unchanged", allow_abbrev=False,
                       description="Run SCRIPT as __main__ with ARGS, CUDA requests redirected to the target. "
                                   "Works under torchrun: torchrun --nproc-per-node 2 -m torch_adapter run train.py")
    p.add_argument("--target", default="auto", help="auto (default), cpu, cuda, npu, xpu, mps, or a profile .toml")
    p.add_argument("--simulate", action="store_true", help="preview TARGET's routing while executing on this machine")
    p.add_argument("--emulate", action="store_true",
                   help="execute on an emulated TARGET (npu): a real out-of-tree device built by the project, whose "
                        "memory is host memory; ops the vendor's table lacks really fall back (copied to the CPU)")
    p.add_argument("--report", action="store_true",
                   help="print a one-screen report at exit (routing totals, fallbacks with their lines, what was "
                        "redirected, what to do next); `--report full` prints every table")
    p.add_argument("--report-full", action="store_true", help=argparse.SUPPRESS)  # what `--report full` becomes
    p.add_argument("--report-json", metavar="PATH", help="write the routing log (and redirects) as JSON to PATH")
    p.add_argument("--amp-dtype", default="auto", choices=("auto", "float16", "bfloat16", "float32"),
                   help="what autocast('cuda', float16) becomes (default auto: the program's own dtype)")
    p.add_argument("--fallback", default="allow", choices=("allow", "warn", "error"),
                   help="policy for ops the target lacks")
    p.add_argument("--optimize", default="conservative", choices=OPTIMIZATION_LEVELS, metavar="LEVEL",
                   help="optimization_level for the script's models and optimizers: "
                        f"{', '.join(OPTIMIZATION_LEVELS)} (default: conservative, as written; docs/cli.md)")
    p.add_argument("--float16-compute", default="auto", choices=FLOAT16_COMPUTE,
                   help="what the CPU computes float16 matmuls/convolutions/attention in (default auto: its "
                        "fast dtype; float16: off)")
    p.add_argument("--dtype-policy", default="auto", choices=DTYPE_POLICIES,
                   help="what a float16 request (.half(), dtype=torch.float16) gives on the CPU (default auto: "
                        "float32 tensors where float16 is computed in float32, float16 elsewhere; float16: as asked)")
    p.add_argument("--dtype-check", default="raise", choices=("raise", "record", "off"),
                   help="--simulate: a dtype the real target refuses raises its error (default), is recorded, or not checked")
    p.add_argument("--device-count", type=_device_count, default=None, metavar="N",
                   help="how many CUDA devices the CPU target (or the emulated device) shows: a program that "
                        "asks for N GPUs (Lightning's devices=N, mp.spawn over device_count()) starts N ranks on "
                        "the CPU (default: 1, or one per local rank under a launcher)")
    gate = p.add_argument_group("gate (CI: exit 3 when the run exceeds what is allowed; docs/cli.md#gate)")
    gate.add_argument("--max-fallbacks", type=_count, default=None, metavar="N",
                      help="at most N distinct ops may run on the CPU (with --baseline: N new ones)")
    gate.add_argument("--deny", action="append", metavar="OP_OR_CODE",
                      help="an op (aten::nonzero) or reason code (TA-F001, docs/reasons.md) that may not fall back (repeatable)")
    gate.add_argument("--baseline", metavar="ROUTING_JSON",
                      help="an earlier run's --report-json: fail only on new fallbacks, refused ops or slower routes")
    p.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name (like python -m)")
    p.add_argument("script", metavar="SCRIPT", help="the script (or module with -m) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to SCRIPT")
    p.set_defaults(func=_run)


def _device_count(text: str) -> int:
    """``--device-count``'s type: a whole number >= 1 (argparse turns the error into exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of devices >= 1, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of ops >= 0, got {text!r}")
    return value


def _run(args: argparse.Namespace) -> int:
    from ..launch.gate import Gate, check_deny, load_baseline
    from ..launch.runner import run_script

    gate = Gate(args.max_fallbacks, check_deny(args.deny), load_baseline(args.baseline) if args.baseline else None,
                args.baseline or "")
    extra: dict[str, Any] = {} if args.device_count is None else {"device_count": args.device_count}
    if args.emulate:
        extra["emulate"] = True
    report: bool | str = "full" if args.report_full else "summary" if args.report else False
    return run_script(args.script, args.args, module=args.module, target=args.target, simulate=args.simulate,
                      report=report, report_json=args.report_json, amp_dtype=args.amp_dtype,
                      fallback=args.fallback, optimization_level=args.optimize,
                      float16_compute=args.float16_compute, dtype_policy=args.dtype_policy,
                      dtype_check=args.dtype_check, exit_guard=True, gate=gate, **extra)


def _add_targets(sub: Any) -> None:
    p = sub.add_parser("targets", help="list the targets on this machine and the simulated ones")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_targets)


def _targets(args: argparse.Namespace) -> int:
    from ..routing.target import targets

    rows = targets()
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="torch_adapter targets")
    for col in ("name", "kind", "present", "runs on", "devices", "collectives", "ops native/composite/fallback",
                "details"):
        table.add_column(col)
    for r in rows:
        kind = "simulated" if r.get("simulated") else "emulated" if r.get("emulated") else "real"
        ops = (f"{r['native_ops']}/{r['composite_ops']}/{r['fallback_ops']}" if "native_ops" in r else "")
        details = dict(r.get("details", {}))
        note = details.pop("note", "") or details.pop("reason", "")
        details.pop("complete", None)
        text = "; ".join([note, *(f"{k}={v}" for k, v in details.items())]).strip("; ")
        table.add_row(r["name"], kind, "yes" if r.get("present") else "no", str(r.get("device", "")),
                      str(r.get("devices", "")), str(r.get("dist_backend", "")), ops, text)
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torch-adapter", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"torch-adapter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    _add_targets(sub)
    for name in _PLUGINS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # that layer is not part of this build
            raise
        module.register(sub)
    return parser


def _report_words(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``run --report full`` (or ``--report=full``) as the hidden ``--report-full`` flag, and
    ``--report=summary`` as ``--report``: only among run's own options, before SCRIPT (a script's
    own ``--report full`` is its argument). argparse cannot give ``--report`` an optional value
    itself: ``--report train.py`` would take the script as the value."""
    if not argv or argv[0] != "run":
        return argv
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    takes_value = {o for a in sub._actions if a.option_strings and a.nargs is None for o in a.option_strings}
    out, i = [argv[0]], 1
    while i < len(argv):
        tok = argv[i]
        if tok in ("--report=full", "--report=summary") or (tok == "--report" and i + 1 < len(argv)
                                                            and argv[i + 1] in ("full", "summary")):
            word = tok.partition("=")[2] or argv[i + 1]
            out.append("--report-full" if word == "full" else "--report")
            i += 1 if "=" in tok else 2
            continue
        if not tok.startswith("-") or tok == "--":  # SCRIPT: the rest is the script's
            return out + argv[i:]
        out.append(tok)
        if tok in takes_value and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 1
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    parser = build_parser()
    argv = _report_words(parser, list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)  # bad flags: argparse prints usage and exits 2
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return guarded(args.func, args)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
