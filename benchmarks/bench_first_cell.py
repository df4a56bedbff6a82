"""The first cells of a notebook session, everything cold: no compile may happen there (issue 34, item 4).

Each sample is a fresh IPython ``InteractiveShell`` in its own process with an empty start-up cache
(``TORCH_ADAPTER_CACHE_DIR``) and an empty torch extension cache (``TORCH_EXTENSIONS_DIR``), as on the
first day after an install. Timed, one after the other in that process:

- ``first_cell``  ``%load_ext torch_adapter`` + a cell of ops on ``.cuda()`` tensors + ``%adapter``
- ``simulated``   ``%adapter target mps --simulate`` + the same cell
- ``emulated``    ``%adapter target npu --emulate`` + the same cell

in two install states, interleaved round by round:

- ``installed``   the C++ parts the install compiled (``torch_adapter/_built``, ``hatch_build.py``)
- ``bare``        none anywhere and no compiler (``TORCH_ADAPTER_PACKAGED_BUILDS=off``, ``CXX`` missing):
                  the pure-Python stand-ins serve. The emulated device has none (it would compile),
                  so ``bare`` skips it.

Goal: each timed step under 5 s on this machine. Prints a table; JSON with the CPU flags and load:

    python benchmarks/bench_first_cell.py --rounds 3            # benchmarks/results/first_cell.json
    python benchmarks/bench_first_cell.py --rounds 5 --figures  # also docs/figures/first_cell.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

GOAL_S = 5.0
STEPS = ("first_cell", "simulated", "emulated")

CHILD = r"""
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
CELL = "x = torch.randn(64, 64).cuda()\ny = (x @ x).relu().sum()\nfloat(y)"
def timed(*lines):
    t = time.perf_counter()
    for line in lines:
        r = shell.run_cell(line, store_history=True)
        if not r.success:
            raise SystemExit(f"cell failed: {line!r}: {r.error_in_exec or r.error_before_exec}")
    return time.perf_counter() - t
shell.run_cell("import torch")  # torch's own import is the same with or without the adapter: untimed
out = {"first_cell": timed("%load_ext torch_adapter", CELL, "%adapter")}
out["simulated"] = timed("%adapter target mps --simulate", CELL)
if "--emulated" in sys.argv:
    out["emulated"] = timed("%adapter target npu --emulate", CELL)
print("RESULT " + json.dumps(out))
"""


def _env(state: str, work: Path) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "TORCH_ADAPTER_CACHE_DIR": tempfile.mkdtemp(dir=work, prefix="cache-"),
           "TORCH_EXTENSIONS_DIR": tempfile.mkdtemp(dir=work, prefix="ext-"),
           "PYTHONPYCACHEPREFIX": str(work / "pyc")}  # bytecode as an installed package has it
    for name in ("TORCH_ADAPTER_CACHE", "TORCH_ADAPTER_AUTOINSTALL", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    if state == "bare":
        env["TORCH_ADAPTER_PACKAGED_BUILDS"] = "off"
        env["CXX"] = str(work / "no-compiler")  # no background build either: the stand-ins alone
    return env


def sample(state: str, work: Path) -> dict[str, float]:
    args = [sys.executable, "-c", CHILD] + (["--emulated"] if state == "installed" else [])
    out = subprocess.run(args, env=_env(state, work), capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{state} failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    if "compiling" in out.stderr or "building the emulated device" in out.stderr:
        raise SystemExit(f"{state}: a C++ part was compiled in a cell:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def installed_parts() -> list[str]:
    from torch_adapter.core.cpp_build import packaged_dir

    folder = packaged_dir()
    return sorted(p.name for p in folder.glob("*.so")) if folder and folder.is_dir() else []


def run(rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-first-cell-"))
    states = ("installed", "bare")
    sample("installed", work)  # untimed: the bytecode cache filled (an installed package has its .pyc)
    start = harness.conditions(threads=1)
    samples: dict[str, dict[str, list[float]]] = {s: {k: [] for k in STEPS} for s in states}
    for r in range(rounds):
        for state in (states if r % 2 == 0 else states[::-1]):  # alternated: neither always first
            for step, seconds in sample(state, work).items():
                samples[state][step].append(seconds)
        print(f"round {r + 1}/{rounds}: " + "; ".join(
            f"{s} " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in samples[s].items() if v) for s in states), flush=True)
    rows: dict[str, Any] = {}
    for state in states:
        for step, ts in samples[state].items():
            if not ts:
                rows[f"{state}/{step}"] = {"skipped": "the emulated device has no pure-Python stand-in: a bare "
                                                      "install compiles it when a program asks for it"}
                continue
            med = statistics.median(ts)
            rows[f"{state}/{step}"] = {"median_s": round(med, 3), "min_s": round(min(ts), 3),
                                       "max_s": round(max(ts), 3), "goal_s": GOAL_S, "passed": med < GOAL_S,
                                       "samples": [round(t, 3) for t in ts]}
    end = harness.conditions(threads=1, own=1.0)
    return {"name": "first_cell", "rounds": rounds, "conditions_start": start, "conditions_end": end,
            "loaded": start["loaded"] or end["loaded"], "installed_parts": installed_parts(), "results": rows}


def markdown(data: dict[str, Any]) -> str:
    cpu = data["conditions_end"].get("cpu", {})
    lines = ["# The first cells, cold (bench_first_cell.py)", "",
             f"{data['rounds']} rounds, a fresh IPython shell per sample, empty start-up and extension caches; "
             f"CPU kind {cpu.get('kind')} (flags {' '.join(cpu.get('flags', []))}); "
             f"{data['conditions_end']['cpu_count']} cores, 1 intra-op thread; load average "
             f"{data['conditions_start']['loadavg']} → {data['conditions_end']['loadavg']}"
             f"{' (LOADED)' if data['loaded'] else ''}.", "",
             f"installed: the parts compiled at install ({len(data['installed_parts'])}: "
             f"{', '.join(p.removeprefix('torch_adapter_').rsplit('_', 1)[0] for p in data['installed_parts']) or 'none'}); "
             "bare: none and no compiler, the pure-Python stand-ins.", "",
             "| install | step | median s | min–max s | goal |", "|---|---|---|---|---|"]
    for name, row in data["results"].items():
        state, step = name.split("/")
        if "skipped" in row:
            lines.append(f"| {state} | {step} | — | — | skipped: {row['skipped']} |")
            continue
        lines.append(f"| {state} | {step} | {row['median_s']:.2f} | {row['min_s']:.2f}–{row['max_s']:.2f} | "
                     f"<{row['goal_s']:.0f} s {'pass' if row['passed'] else 'miss'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--figures", action="store_true", help="also write docs/figures/first_cell.{json,md}")
    args = parser.parse_args(argv)
    if not installed_parts():
        print("note: no C++ parts in torch_adapter/_built (installed with TORCH_ADAPTER_BUILD_AT_INSTALL=0?): "
              "'installed' then measures the bare state too", file=sys.stderr)
    data = run(args.rounds)
    text = markdown(data)
    print(text)
    for folder in [harness.RESULTS_DIR] + ([harness.FIGURES_DIR] if args.figures else []):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "first_cell.json").write_text(json.dumps(data, indent=2) + "\n")
        if folder == harness.FIGURES_DIR:
            (folder / "first_cell.md").write_text(text)
        print(f"wrote {folder / 'first_cell.json'}")
    return 0 if all(r.get("passed", True) for r in data["results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
