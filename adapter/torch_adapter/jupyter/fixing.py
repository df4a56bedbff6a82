"""``%adapter fix [--apply]``: the last cell's fallbacks and refusals as a verified patch of the cell.

The records are the last observed cell's (the per-cell routing log). Sites in that cell become an edit of
its source (``check/fix.py``; line magics and shell lines are kept as they are), shown as a unified diff
of the cell, **verified in this kernel**: the cell as it was and the changed cell each run once more, in
a copy of the namespace (names the cell binds are not rebound in yours; its magic and shell lines
left out), from the same torch RNG state
(restored afterwards), under a routing trace on the current target. The change passes when the changed
cell raises nothing the original did not, records no fallback or refusal at the changed lines, prints
the same output (text equal, numbers within ``--rtol``/``--atol``) and binds the same values (tensors,
numbers, lists, dicts) to the names it assigns. Objects the cell changes in place (a model's weights, an
optimizer's state) are changed by those two runs too: run ``%adapter fix`` on cells that compute, or
re-run the cells that set up the state afterwards. ``--apply`` puts the verified cell into the next input
(``set_next_input``); nothing in the notebook is overwritten.

Sites in files (a module the cell imported) are shown as the patch ``torch-adapter fix`` would make, not
verified here and never written: verify and write them with ``torch-adapter fix --target T SCRIPT``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import linecache
import re
import shlex
from pathlib import Path
from typing import Any

__all__ = ["fix_magic", "mask_magics"]

_MAGIC = re.compile(r"^(\s*)([%!]|.*\?\s*$)")


def mask_magics(source: str) -> tuple[str, dict[int, str]]:
    """``source`` with each IPython line (``%magic``, ``!shell``, ``obj?``) replaced by ``pass`` at its
    indent (so LibCST parses it and line numbers stay), and those lines by number to put back."""
    lines = source.split("\n")
    kept: dict[int, str] = {}
    for i, line in enumerate(lines):
        m = _MAGIC.match(line)
        if m and line.strip() and not line.lstrip().startswith("#"):
            kept[i] = line
            lines[i] = f"{m.group(1)}pass"
    return "\n".join(lines), kept


def _unmask(text: str, kept: dict[int, str]) -> str:
    lines = text.split("\n")
    for i, line in kept.items():
        if i < len(lines) and lines[i].strip() == "pass":
            lines[i] = line
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%adapter fix", add_help=False, exit_on_error=False)
    p.add_argument("--apply", action="store_true")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-6)
    return p


def _run(shell: Any, source: str, name: str) -> tuple[str, dict[str, Any], list[Any], str | None]:
    """Run ``source`` as a cell under ``name`` in a copy of the namespace: (stdout, the copy, its
    records, the error it raised or None)."""
    from ..check.fix import records_of
    from ..routing.trace import trace

    code_text = shell.transform_cell(source)
    linecache.cache[name] = (len(code_text), None, code_text.splitlines(True), name)
    ns = dict(shell.user_ns)
    out = io.StringIO()
    error = None
    with trace(use_observer=False) as log, contextlib.redirect_stdout(out):
        try:
            exec(compile(code_text, name, "exec"), ns)
        except Exception as exc:  # the user's exception: reported, never raised into the magic
            error = f"{type(exc).__name__}: {exc}"
    return out.getvalue(), ns, records_of(log.to_dict()), error


def _verify_cell(shell: Any, old: str, new: str, lines: set[int], rtol: float, atol: float) -> str | None:
    import torch

    from ..check.fix_run import compare_output, compare_values

    state = torch.random.get_rng_state()
    try:
        out0, ns0, rec0, err0 = _run(shell, old, "<adapter-fix-original>")
        torch.random.set_rng_state(state)
        out1, ns1, rec1, err1 = _run(shell, new, "<adapter-fix-patched>")
    finally:
        torch.random.set_rng_state(state)
    if err1 and not err0:
        return f"the changed cell raised {err1}"
    left = [r for r in rec1 if r.line in lines]
    if left:
        return "still recorded at the changed line: " + "; ".join(f"line {r.line} {r.what}" for r in left)
    why = compare_output(out0, out1, rtol, atol)
    if why:
        return why
    for name, value in ns0.items():
        if name.startswith("_") or shell.user_ns.get(name, object()) is value:
            continue  # not bound by the cell
        why = compare_values(value, ns1.get(name), rtol, atol, name)
        if why:
            return why
    return None


def fix_magic(shell: Any, router: Any, line: str) -> dict[str, Any]:
    """``%adapter fix [--apply] [--rtol R] [--atol A]``; the result is kept as ``_adapter_fix``."""
    from IPython.core.error import UsageError

    from ..check.fix import line_map, plan, plan_source, records_of
    from ..core.callsite import cell_of

    try:
        args = _parser().parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise UsageError(f"%adapter fix: expected [--apply] [--rtol R] [--atol A]; got {line!r} ({exc})") from None
    log = router.last_log
    if log is None:
        raise UsageError("%adapter fix: expected a cell that ran ops before it; got none (run the cell to fix first, "
                         "with per-cell routing on: %adapter observe on)")
    last = router.payloads[-1].get("execution_count") if router.payloads else None
    records = records_of(log.to_dict())
    result: dict[str, Any] = {"records": len(records), "cell": None, "files": [], "not_fixed": []}
    cells: dict[int, list[Any]] = {}
    files = []
    for r in records:
        n = cell_of(r.file)
        if n is None and r.file.startswith("<"):
            result["not_fixed"].append(f"{r.file}:{r.line}: {r.what}: generated code, not a cell or a file")
        elif n is None:
            files.append(r)
        else:
            cells.setdefault(n, []).append(r)
    if last is None and cells:  # a shell that keeps no execution counts: the latest cell named
        last = max(cells)
    print(f"%adapter fix: {len(records)} fallback/refusal record(s) in the last cell's routing"
          + ("" if records else ": nothing to fix"))
    for n, recs in sorted(cells.items()):
        if n != last:
            result["not_fixed"] += [f"cell [{n}], line {r.line}: {r.what}: in an earlier cell (code it defines, "
                                    f"called by cell [{last}]); run %adapter fix after cell [{n}] itself"
                                    for r in recs]
            continue
        raw = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None) or shell.user_ns.get("In") or []
        source = raw[n] if 0 <= n < len(raw) else "".join(linecache.getlines(recs[0].file))
        masked, kept = mask_magics(source)
        new, changes, skipped = plan_source(masked, recs)
        result["not_fixed"] += [f"cell [{n}], line {s.record.line}: {s.record.what}: {s.why}" for s in skipped]
        if not changes:
            continue
        to_new = line_map(masked, new)
        lines = {to_new(x) for c in changes for x in range(c.line, c.end_line + 1)}
        new_source = _unmask(new, kept)
        with router.unobserved():  # the verifying runs are not this cell's ops
            why = _verify_cell(shell, masked, new, lines, args.rtol, args.atol)  # magics left out: never re-run
        import difflib

        diff = "".join(difflib.unified_diff(source.splitlines(True), new_source.splitlines(True),
                                            f"a/cell [{n}]", f"b/cell [{n}]"))
        if why is not None:
            result["not_fixed"] += [f"cell [{n}], line {c.line}: {c.rule}: {why} (nothing changed)" for c in changes]
            continue
        print(diff if diff.endswith("\n") else diff + "\n", end="")
        for c in changes:
            print(f"verified: cell [{n}], line {c.line}: {c.rule} "
                  f"({', '.join(sorted({r.op for r in c.records}))} gone, results the same)")
        result["cell"] = {"number": n, "diff": diff, "source": new_source}
        if args.apply:
            shell.set_next_input(new_source, replace=False)
            print("applied: the fixed cell is the next input (run it in place of the original)")
    if files:
        edits, skipped = plan(files, Path.cwd(), Path.cwd())
        for e in edits:
            print(e.diff(), end="")
            print(f"not verified: {e.label}: a file's patch is verified by re-running a program: "
                  f"`torch-adapter fix --target {log.target} ... SCRIPT` (nothing written)")
            result["files"].append({"file": e.label, "diff": e.diff()})
        result["not_fixed"] += [s.text() for s in skipped]
    for text in result["not_fixed"]:
        print(f"not fixed: {text}")
    shell.user_ns["_adapter_fix"] = result
    return result
