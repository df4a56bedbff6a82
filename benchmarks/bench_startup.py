"""Start-up time: a 3-line CUDA-written script in fresh interpreters, interleaved.

Configurations (each a fresh ``python`` process, wall time from spawn to exit):

- ``plain``        ``python script.py`` (the script takes the CPU: ``torch.cuda.is_available()`` is False)
- ``real``         ``torch-adapter run script.py`` (the CPU target)
- ``sim``          ``torch-adapter run --target mps --simulate script.py``
- ``real_cold`` / ``sim_cold``: the same with an empty start-up cache folder each run
  (``TORCH_ADAPTER_CACHE_DIR`` = a new folder): what a first run after an install or upgrade pays

plus the first ``%adapter target mps --simulate`` in an IPython ``InteractiveShell`` (a subprocess
per sample, the extension loaded, then the magic timed), warm and cold cache.

Goals (issue 22): ``sim`` within +0.5 s of ``plain``, ``real`` within +0.2 s, the magic < 0.5 s,
warm cache. Children get a private bytecode cache (``PYTHONPYCACHEPREFIX``, as an installed package
has its ``.pyc`` files), one intra-op thread, and the warm cache folder prepared by untimed runs.

    python benchmarks/bench_startup.py --rounds 7           # JSON to benchmarks/results/startup.json
    python benchmarks/bench_startup.py --rounds 9 --figures # also docs/figures/startup.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"
GOALS = {"real": 0.2, "sim": 0.5}  # seconds over plain
MAGIC_GOAL = 0.5

SCRIPT = """import torch
x = torch.ones(3, device="cuda" if torch.cuda.is_available() else "cpu")
print(float((x * 2).sum()))
"""

MAGIC = """import time, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "torch_adapter")
t = time.perf_counter()
shell.run_line_magic("adapter", "target mps --simulate")
print("MAGIC", time.perf_counter() - t)
"""


def machine(own: float = 0.0) -> dict[str, Any]:
    """CPU flags that matter to torch, threads, load average (loaded when other work's load is above
    0.5 per core; ``own``: this benchmark's one busy child, read at the end: harness.is_loaded)."""
    flags: list[str] = []
    try:
        text = Path("/proc/cpuinfo").read_text()
        line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
        wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "fma")
        flags = [f for f in line.split(":", 1)[-1].split() if f in wanted]
    except OSError:
        pass
    load = list(os.getloadavg())
    cores = os.cpu_count() or 1
    return {"cpu_flags": flags, "cores": cores, "threads": 1, "load_average": [round(x, 2) for x in load],
            "own_load": own, "loaded": harness.is_loaded(load, cores, own), "python": sys.version.split()[0]}


def _env(cache: str, pyc: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_ADAPTER_CACHE_DIR": cache, "PYTHONPYCACHEPREFIX": pyc}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TORCH_ADAPTER_CACHE", None)
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return env


def _command(config: str, script: str) -> list[str]:
    if config == "plain":
        return [sys.executable, script]
    run = [sys.executable, "-m", "torch_adapter", "run"]
    if config.startswith("sim"):
        run += ["--target", "mps", "--simulate"]
    return [*run, script]


def _spawn(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, str, str]:
    """Run ``cmd``: (wall s, CPU s of the child: user + system, return code, stdout, stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, proc.returncode, out.read().decode(), err.read().decode()


def _once(config: str, script: str, warm: str, pyc: str, work: Path) -> tuple[float, float]:
    cache = warm if not config.endswith("_cold") else tempfile.mkdtemp(dir=work, prefix="cold-")
    wall, cpu, rc, out, err = _spawn(_command(config, script), _env(cache, pyc))
    if rc != 0 or out.strip() != "6.0":
        raise SystemExit(f"{config} failed (rc {rc}): {out}\n{err}")
    return wall, cpu


def _magic(cold: bool, warm: str, pyc: str, work: Path) -> float:
    cache = tempfile.mkdtemp(dir=work, prefix="cold-") if cold else warm
    out = subprocess.run([sys.executable, "-c", MAGIC], env=_env(cache, pyc), capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("MAGIC ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"magic failed (rc {out.returncode}): {out.stdout}\n{out.stderr}")
    return float(lines[-1].split()[1])


def run(rounds: int, configs: list[str], magic: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    script = str(work / "three_lines.py")
    Path(script).write_text(SCRIPT)
    warm, pyc = str(work / "warm-cache"), str(work / "pyc")
    for config in ("plain", "real", "sim"):  # untimed: bytecode compiled, the warm cache filled
        _once(config, script, warm, pyc, work)
    if magic:
        _magic(False, warm, pyc, work)
    times: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    magic_times: dict[str, list[float]] = {"magic": [], "magic_cold": []} if magic else {}
    start = machine()
    for r in range(rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]  # rotated: no config always first
        for config in order:
            wall, used = _once(config, script, warm, pyc, work)
            times[config].append(wall)
            cpu[config].append(used)
        for name in magic_times:
            magic_times[name].append(_magic(name.endswith("_cold"), warm, pyc, work))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{c} {times[c][-1]:.2f}s (cpu {cpu[c][-1]:.2f})"
                                                   for c in configs), flush=True)
    plain = statistics.median(times["plain"])
    rows = {}
    for config, ts in times.items():
        med = statistics.median(ts)
        goal = GOALS.get(config)
        paired = statistics.median(t - p for t, p in zip(ts, times["plain"]))
        cpu_over = statistics.median(cpu[config]) - statistics.median(cpu["plain"])
        rows[config] = {"median_s": round(med, 3), "min_s": round(min(ts), 3), "max_s": round(max(ts), 3),
                        "over_plain_s": round(med - plain, 3), "paired_over_plain_s": round(paired, 3),
                        "cpu_median_s": round(statistics.median(cpu[config]), 3), "cpu_over_plain_s": round(cpu_over, 3),
                        "goal_over_plain_s": goal, "passed": None if goal is None else med - plain <= goal,
                        "samples": [round(t, 3) for t in ts]}
    for name, ts in magic_times.items():
        med = statistics.median(ts)
        rows[name] = {"median_s": round(med, 3), "min_s": round(min(ts), 3), "max_s": round(max(ts), 3),
                      "goal_s": MAGIC_GOAL if name == "magic" else None,
                      "passed": med <= MAGIC_GOAL if name == "magic" else None, "samples": [round(t, 3) for t in ts]}
    end = machine(own=1.0)
    return {"name": "startup", "rounds": rounds, "machine_start": start, "machine_end": end,
            "loaded": start["loaded"] or end["loaded"], "results": rows}


def markdown(data: dict[str, Any]) -> str:
    m = data["machine_end"]
    lines = ["# Start-up time (bench_startup.py)", "",
             f"{data['rounds']} interleaved rounds of fresh interpreters; CPU flags {' '.join(m['cpu_flags'])}; "
             f"{m['cores']} cores, {m['threads']} intra-op thread; load average {data['machine_start']['load_average']} → "
             f"{m['load_average']}{' (LOADED: > 0.5 per core)' if data['loaded'] else ''}.", "",
             "Wall time from spawn to exit; CPU = the child's user + system time (less disturbed by other load).", "",
             "| configuration | median s | min–max s | over plain s (paired) | CPU s (over plain) | goal |",
             "|---|---|---|---|---|---|"]
    for name, row in data["results"].items():
        over = f"{row['over_plain_s']:+.2f} ({row['paired_over_plain_s']:+.2f})" if "over_plain_s" in row else ""
        goal = row.get("goal_over_plain_s") or row.get("goal_s")
        verdict = "" if goal is None else f"{'+' if 'over_plain_s' in row else '<'}{goal} s " + \
            ("pass" if row["passed"] else "miss")
        cpu_text = f"{row['cpu_median_s']:.2f} ({row['cpu_over_plain_s']:+.2f})" if "cpu_median_s" in row else ""
        lines.append(f"| {name} | {row['median_s']:.2f} | {row['min_s']:.2f}–{row['max_s']:.2f} | {over} | {cpu_text} "
                     f"| {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default="plain,real,sim,real_cold,sim_cold")
    parser.add_argument("--no-magic", action="store_true", help="skip the IPython magic timing")
    parser.add_argument("--figures", action="store_true", help="also write docs/figures/startup.{json,md}")
    parser.add_argument("--pin", type=int, default=harness.default_pin(),
                        help="run every sample on this CPU (default: the last one; -1: not pinned)")
    args = parser.parse_args(argv)
    if args.pin >= 0:
        os.sched_setaffinity(0, {args.pin})  # the children inherit it
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if configs[0] != "plain":
        configs.insert(0, "plain")
    data = run(args.rounds, configs, not args.no_magic)
    data["pinned_cpu"] = args.pin if args.pin >= 0 else None
    text = markdown(data)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {RESULTS / 'startup.json'}")
    if args.figures:
        (FIGURES / "startup.json").write_text(json.dumps(data, indent=2) + "\n")
        (FIGURES / "startup.md").write_text(text)
        print(f"wrote {FIGURES / 'startup.json'} and startup.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
