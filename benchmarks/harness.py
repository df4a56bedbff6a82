"""The benchmark harness: one workload under several configurations, interleaved.

A :class:`Configuration` is a name, a factory of context managers entered around every
block, untimed (``plain`` enters nothing, ``adapted`` enters ``torch_adapter.adapted(...)``),
optionally a second factory entered *inside* the timed region (what a per-cell hook costs,
its start and stop included: an op observer), and the device string the workload is built for (see ``benchmarks/workloads.py`` for why
plain gets the machine's real device and adapted configurations get ``"cuda"``).

:func:`run` measures them the way a noisy shared machine needs:

1. *build* — for each configuration, inside its context: build the workload (same seed,
   so the same model and inputs), then ``warmup`` untimed steps;
2. *interleave* — ``repeats`` rounds; each round runs one timed block per configuration,
   in the order given (``"abab"``: A B A B ...) or mirrored every other round
   (``"abba"``: A B B A ..., which cancels a linear drift of the machine's load);
3. *block* — ``gc.collect()``, enter the context, ``settle`` untimed steps, then the timed
   region: enter the timed context (if any), ``steps`` steps, exit it; wall time and process
   CPU time are both recorded.

Results are medians over blocks. *Throughput kept* of a configuration is
``median(plain seconds/step) / median(config seconds/step)`` — the ratio of the medians.
Reported beside it: the *paired* ratio (median over rounds of ``plain_r / config_r``, with
its min and max), the *best* ratio (fastest plain block / fastest config block) and the
ratio of CPU times. When other processes share the cores, wall times swing with their
load (the spikes are one-sided: a block is only ever slowed down), while adjacent blocks,
the fastest blocks and CPU time swing less; read them together.

:func:`print_table` renders a rich table; :func:`write_json` writes
``benchmarks/results/NAME.json`` (git-ignored), or ``docs/figures/NAME.json`` when asked (``--json NAME``:
the committed figures the docs quote; docs/figures/README.md). The CLI helpers give every ``bench_*.py``
script the same arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

__all__ = [
    "Configuration",
    "ConfigResult",
    "BenchResult",
    "plain",
    "adapted",
    "schedule",
    "run",
    "print_table",
    "write_json",
    "RESULTS_DIR",
    "FIGURES_DIR",
    "json_folder",
    "conditions",
    "add_arguments",
    "select",
    "run_from_args",
]

_ROOT = Path(__file__).resolve().parent.parent
# Where a run writes unless told: benchmarks/results/ (git-ignored). The committed figures the docs quote
# (docs/figures/, docs/figures/README.md) are written only when asked — a bare ``--json NAME`` or
# ``--figures`` — so a trial run on a loaded machine cannot replace a quoted figure by accident.
RESULTS_DIR = _ROOT / "benchmarks" / "results"
FIGURES_DIR = _ROOT / "docs" / "figures"


def json_folder(json_arg: str | Path) -> Path:
    """The folder ``--json`` names: a bare NAME means the committed figures (docs/figures/NAME.json, the
    commands docs/figures/README.md lists); a path with a folder is used as given."""
    parent = Path(json_arg).parent
    return FIGURES_DIR if parent == Path(".") else parent


@dataclass(frozen=True)
class Configuration:
    """How one side of the comparison runs: a context around each block, and a device."""

    name: str
    context: Callable[[], ContextManager[Any]]
    device: str
    description: str = ""
    goal: float | None = None  # throughput kept that counts as a pass (e.g. 0.995)
    timed: Callable[[], ContextManager[Any]] | None = None  # entered inside the timed region


def plain(device: str | None = None, *, name: str = "plain") -> Configuration:
    """Torch untouched. ``device`` defaults to ``"cuda"`` with a real CUDA device, else ``"cpu"``.

    A second plain configuration under another name (``plain(name="plain_again")``) is an
    A/A control: its "kept" shows how much the machine's noise alone moves the ratio.
    """
    if device is None:
        device = "cuda" if _real_cuda() else "cpu"
    return Configuration(name, contextlib.nullcontext, device, "torch as installed")


def adapted(target: str = "cpu", *, name: str = "adapted", goal: float | None = None,
            **options: Any) -> Configuration:
    """``torch_adapter.adapted(target=..., **options)`` around each block; the workload asks for "cuda"."""

    def context() -> ContextManager[Any]:
        import torch_adapter

        return torch_adapter.adapted(target=target, **options)

    opts = "".join(f", {k}={v!r}" for k, v in options.items())
    return Configuration(name, context, "cuda", f"torch_adapter.adapted(target={target!r}{opts})", goal)


def _real_cuda() -> bool:
    from torch_adapter.core.torch_private import cuda_device_count

    return cuda_device_count() > 0


@dataclass
class ConfigResult:
    """Per-configuration measurements; times are seconds per step, one entry per block."""

    name: str
    device: str
    description: str
    goal: float | None
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    build_s: float = 0.0
    # filled by run() once all blocks are in
    median_s: float = 0.0
    min_s: float = 0.0
    max_s: float = 0.0
    throughput: float = 0.0
    kept: float = 0.0  # median(plain) / median(this): throughput kept, from medians
    paired_kept: float = 0.0  # median over rounds of plain_r / this_r
    paired_min: float = 0.0
    paired_max: float = 0.0
    cpu_kept: float = 0.0  # median(plain cpu) / median(this cpu)
    best_kept: float = 0.0  # min(plain) / min(this): least disturbed by other processes' spikes

    @property
    def passed(self) -> bool | None:
        return None if self.goal is None else self.kept >= self.goal


@dataclass
class BenchResult:
    """Everything one :func:`run` measured, ready for a table or JSON."""

    name: str
    workload: str
    repeats: int
    steps: int
    warmup: int
    settle: int
    order: str
    schedule: list[str]
    configs: list[ConfigResult]
    meta: dict[str, Any]

    def by_name(self, name: str) -> ConfigResult:
        for cfg in self.configs:
            if cfg.name == name:
                return cfg
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for cfg, out in zip(self.configs, data["configs"]):
            out["passed"] = cfg.passed
        return data


def schedule(names: Sequence[str], repeats: int, order: str = "abab") -> list[str]:
    """The block order: ``abab`` repeats ``names``; ``abba`` mirrors every other round."""
    if order not in ("abab", "abba"):
        from torch_adapter.errors import UsageError, format_error

        raise UsageError(format_error("harness.schedule()", "order 'abab' or 'abba'", repr(order),
                                      fix='pass order="abab"'))
    out: list[str] = []
    for r in range(repeats):
        out.extend(reversed(names) if order == "abba" and r % 2 else names)
    return out


def _block(step: Callable[[], None], cfg: Configuration, steps: int, settle: int) -> tuple[float, float]:
    gc.collect()
    with cfg.context():
        for _ in range(settle):
            step()
        timed = cfg.timed() if cfg.timed is not None else contextlib.nullcontext()
        c0, t0 = time.process_time(), time.perf_counter()
        with timed:
            for _ in range(steps):
                step()
        t1, c1 = time.perf_counter(), time.process_time()
    return (t1 - t0) / steps, (c1 - c0) / steps


def run(workload: Any, configs: Sequence[Configuration], *, repeats: int = 5, steps: int = 5,
        warmup: int = 2, settle: int = 1, order: str = "abab", name: str | None = None,
        threads: int | None = None, min_block_s: float = 0.0, budget_s: float | None = None,
        progress: Callable[[str], None] | None = None) -> BenchResult:
    """Measure ``workload`` (a ``workloads.Workload``) under ``configs``, interleaved.

    The first configuration is the baseline that ratios are computed against. With
    ``min_block_s``, ``steps`` grows until a baseline block lasts at least that long (short
    steps are otherwise dominated by timer and scheduler noise). With ``budget_s``, no new
    round starts once that many seconds have passed since the first timed block (at least
    two rounds run); ``repeats`` in the result then says how many ran.
    """
    import torch

    if not configs or repeats < 1 or steps < 1:
        from torch_adapter.errors import UsageError, format_error

        raise UsageError(format_error(
            "harness.run()", "at least one configuration, repeats >= 1 and steps >= 1",
            f"{len(configs)} configurations, repeats={repeats}, steps={steps}",
            fix="e.g. run(workload, [plain(), adapted()], repeats=5, steps=5)"))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        from torch_adapter.errors import UsageError, format_error

        raise UsageError(format_error("harness.run()", "distinct configuration names", repr(names)))
    say = progress or (lambda _msg: None)
    prev_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    meta = _meta()
    try:
        results = {c.name: ConfigResult(c.name, c.device, c.description, c.goal) for c in configs}
        steps_fn: dict[str, Callable[[], None]] = {}
        for cfg in configs:
            t0 = time.perf_counter()
            with cfg.context(), (cfg.timed or contextlib.nullcontext)():
                steps_fn[cfg.name] = step = workload.build(cfg.device)
                for _ in range(warmup):
                    step()
            results[cfg.name].build_s = time.perf_counter() - t0
            say(f"built {workload.name} under {cfg.name} in {results[cfg.name].build_s:.1f} s")
        if min_block_s > 0:
            one, _ = _block(steps_fn[configs[0].name], configs[0], 1, 0)
            steps = max(steps, math.ceil(min_block_s / max(one, 1e-9)))
        by_name = {c.name: c for c in configs}
        planned = schedule(names, repeats, order)
        order_run: list[str] = []
        started = time.perf_counter()
        for i, cname in enumerate(planned):
            new_round = i % len(names) == 0
            if new_round and budget_s is not None and i >= 2 * len(names) \
                    and time.perf_counter() - started > budget_s:
                say(f"time budget of {budget_s:.0f} s spent: stopping after {i // len(names)} rounds")
                repeats = i // len(names)
                meta["stopped_early"] = True
                break
            wall, cpu = _block(steps_fn[cname], by_name[cname], steps, settle)
            results[cname].wall.append(wall)
            results[cname].cpu.append(cpu)
            order_run.append(cname)
            say(f"[{i + 1}/{len(planned)}] {cname}: {wall * 1e3:.1f} ms/step")
    finally:
        torch.set_num_threads(prev_threads)
    meta["loadavg_end"] = _loadavg()
    meta["loaded"] = meta.get("loaded") or conditions(own=min(torch.get_num_threads(), os.cpu_count() or 1))["loaded"]
    out = BenchResult(name or workload.name, workload.name, repeats, steps, warmup, settle, order,
                      order_run, [results[n] for n in names], meta)
    _summarize(out)
    return out


def _summarize(result: BenchResult) -> None:
    base = result.configs[0]
    for cfg in result.configs:
        cfg.median_s = statistics.median(cfg.wall)
        cfg.min_s, cfg.max_s = min(cfg.wall), max(cfg.wall)
        cfg.throughput = 1.0 / cfg.median_s
        cfg.kept = statistics.median(base.wall) / cfg.median_s
        cfg.cpu_kept = statistics.median(base.cpu) / statistics.median(cfg.cpu)
        cfg.best_kept = min(base.wall) / cfg.min_s
        paired = [b / c for b, c in zip(base.wall, cfg.wall)]
        cfg.paired_kept = statistics.median(paired)
        cfg.paired_min, cfg.paired_max = min(paired), max(paired)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def default_pin() -> int:
    """The CPU fresh-interpreter benchmarks pin their samples to: the last one (-1 where affinity is
    not available or there is one CPU)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return -1
    return cpus[-1] if len(cpus) > 1 else -1


def pinned(cpu: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that pins the child to ``cpu`` (None: not pinned, ``cpu`` < 0)."""
    if cpu < 0:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, {cpu})

    return pin


def is_loaded(load: list[float] | None, cores: int, own: float = 0.0) -> bool:
    """Load above 0.5 per core from work other than the benchmark's own: ``own`` is what the benchmark
    itself adds to the 1-minute average (its busy threads, when read at the end of a run; a
    single-threaded benchmark alone on an idle 2-core machine reads 1.0 = 0.5 per core by itself)."""
    return bool(load and load[0] - own > 0.5 * cores)


def conditions(threads: int | None = None, *, own: float = 0.0) -> dict[str, Any]:
    """What every figure records about the machine: the CPU's features (flags, kind), the thread
    count, the load average, and ``loaded`` (load from other work above 0.5 per core, :func:`is_loaded`:
    a figure to read with care). ``own``: the benchmark's own busy threads (read at the end of a run)."""
    import torch

    try:
        from torch_adapter.core.cpu_features import cpu_features

        cpu = cpu_features().as_dict()
    except ImportError:  # pragma: no cover - a checkout without the adapter on the path
        cpu = {}
    load = _loadavg()
    cores = os.cpu_count() or 1
    return {"cpu": cpu, "cpu_count": cores, "torch_threads": threads or torch.get_num_threads(), "loadavg": load,
            "own_load": own, "loaded": is_loaded(load, cores, own)}


def _meta() -> dict[str, Any]:
    import torch

    cond = conditions()
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": _loadavg(),
        "cpu": cond["cpu"],
        "loaded": cond["loaded"],
        "argv": sys.argv,
    }


def print_table(result: BenchResult, console: Any = None) -> None:
    """A rich table: median ms/step, spread, throughput, and throughput kept vs the first config."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a log file: don't squeeze the table to 80 columns
            console = Console(width=150)
    table = Table(title=f"{result.name}: {result.workload}, {result.repeats} rounds x "
                        f"{result.steps} steps, order {result.order}")
    for col in ("config", "device", "ms/step", "min-max ms", "steps/s", "kept",
                "paired kept [min-max]", "best kept", "cpu kept", "goal"):
        table.add_column(col, justify="left" if col in ("config", "device") else "right")
    for cfg in result.configs:
        goal = "" if cfg.goal is None else f"{cfg.goal:.1%} " + ("[green]pass" if cfg.passed else "[red]miss")
        table.add_row(
            cfg.name, cfg.device, f"{cfg.median_s * 1e3:.1f}",
            f"{cfg.min_s * 1e3:.1f}-{cfg.max_s * 1e3:.1f}", f"{cfg.throughput:.2f}",
            f"{cfg.kept:.2%}", f"{cfg.paired_kept:.2%} [{cfg.paired_min:.1%}-{cfg.paired_max:.1%}]",
            f"{cfg.best_kept:.2%}", f"{cfg.cpu_kept:.2%}", goal)
    console.print(table)
    meta = result.meta
    console.print(f"load average start {meta.get('loadavg_start')} end {meta.get('loadavg_end')}; "
                  f"torch threads {meta.get('torch_threads')}; kept = median(plain)/median(config)")


def write_json(result: BenchResult, directory: str | Path | None = None) -> Path:
    """Write ``DIRECTORY/NAME.json`` (default ``benchmarks/results/``); returns the path."""
    directory = Path(directory) if directory is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    path.write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return path


def write_meta_json(name: str, data: dict[str, Any], directory: str | Path | None = None) -> Path:
    """Write a measurement that is not a timing table (``DIRECTORY/NAME.json``) with the machine's
    conditions beside it; returns the path."""
    import torch

    directory = Path(directory) if directory is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    cond = conditions()
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_average": list(os.getloadavg()),
            "cpu": cond["cpu"], "loaded": cond["loaded"]}
    path.write_text(json.dumps({"name": name, "meta": meta, **data}, indent=2) + "\n")
    print(f"wrote {path}")
    return path


# -- CLI helpers shared by the bench_*.py scripts ----------------------------------------
def add_arguments(parser: argparse.ArgumentParser, *, workloads: Sequence[str],
                  default_workload: str = "sd_unet") -> None:
    """The arguments every bench script takes."""
    parser.add_argument("--workload", default=default_workload, choices=[*workloads, "all"],
                        help="which workload to run (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after building (default: %(default)s)")
    parser.add_argument("--min-block", type=float, default=1.0, metavar="SECONDS",
                        help="raise --steps until a plain block lasts this long (default: %(default)s)")
    parser.add_argument("--settle", type=int, default=1, help="untimed steps at the start of each block")
    parser.add_argument("--order", choices=("abab", "abba"), default="abab", help="interleaving order")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the run")
    parser.add_argument("--json", default=None, metavar="NAME",
                        help="write docs/figures/NAME.json (the committed figures); a path with a folder is "
                             "used as given (default: benchmarks/results/SCRIPT_WORKLOAD.json)")
    parser.add_argument("--configs", default=None, metavar="A,B,...",
                        help="configurations to compare, baseline first (default: all the script has)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="start no new round after this long (at least 2 rounds run)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: fewer rounds and steps, and a 75 s budget for the timed rounds")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def select(available: Sequence[Configuration], spec: str | None) -> list[Configuration]:
    """The configurations named in ``spec`` ("plain,adapted"), in that order; all when None."""
    if spec is None:
        return list(available)
    by_name = {c.name: c for c in available}
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        from torch_adapter.errors import UsageError, format_error

        raise UsageError(format_error("--configs", f"a comma-separated list from {list(by_name)}",
                                      repr(spec), fix=f"e.g. --configs {','.join(by_name)}"))
    return [by_name[n] for n in wanted]


def run_from_args(args: argparse.Namespace, workload_list: Sequence[Any],
                  configs: Sequence[Configuration], *, default_name: str,
                  quick: dict[str, float] | None = None) -> list[BenchResult]:
    """Run each workload as the parsed arguments say; print tables; write JSON.

    ``configs`` are all the script offers; ``--configs`` picks among them.
    """
    configs = select(configs, getattr(args, "configs", None))
    if args.quick:
        for key, value in (quick or {"repeats": 5, "steps": 2, "warmup": 1, "min_block": 0}).items():
            setattr(args, key, value)
        if args.budget is None:
            args.budget = 75.0 / len(workload_list)
    say = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    results = []
    for workload in workload_list:
        name = f"{default_name}_{workload.name}"
        result = run(workload, configs, repeats=args.repeats, steps=args.steps, warmup=args.warmup,
                     settle=args.settle, order=args.order, name=name, threads=args.threads,
                     min_block_s=args.min_block, budget_s=args.budget, progress=say)
        if args.json:
            target = Path(args.json)
            stem = target.stem if target.suffix == ".json" else target.name
            directory = json_folder(target)
            result.name = f"{stem}_{workload.name}" if len(workload_list) > 1 else stem
        else:
            directory = None
        print_table(result)
        results.append(result)
        print(f"wrote {write_json(result, directory)}")
    return results
