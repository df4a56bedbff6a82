"""``torch-adapter run LAUNCHER …``: a launcher runs unadapted, the processes it starts adapted.

``torch-adapter run accelerate launch train.py`` (or ``torchrun …``, ``deepspeed …``) runs
the launcher's console script in this process without installing the adapter — the
launcher counts devices and sets its environment as it would on the host — with
``TORCH_ADAPTER_AUTOINSTALL`` set, so every Python process it starts is adapted at
interpreter start (the ``.pth`` hook). Each adapted child announces itself in a private
folder (:mod:`._child_report`); afterwards the run says what was adapted and what was
not, and with ``--report`` prints each child's report labelled with its rank.

A command that is not a console script (a shell script, a binary) runs as a subprocess
with the same environment: only the Python processes it starts are adapted, and the run
says so before and after. :data:`LAUNCHERS` is the data: the launchers the docs name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

__all__ = ["LAUNCHERS", "RANK_LAUNCHERS", "find", "run_launcher"]

# console script -> what it starts (docs/launchers.md)
LAUNCHERS: dict[str, str] = {
    "accelerate": "accelerate launch: one Python process per rank (torchrun's agent, or python SCRIPT)",
    "torchrun": "torchrun: one Python process per rank (torch.distributed.elastic)",
    "deepspeed": "deepspeed: one Python process per rank (its launcher, then torch.distributed)",
}

# programs (not Python console scripts) that start the ranks of a job: they run as a subprocess with
# this environment; the ranks they start on this machine inherit it (docs/launchers.md, "Past one machine")
RANK_LAUNCHERS: dict[str, str] = {
    "mpiexec": "MPI (Open MPI, MPICH): one process per rank; ranks on other hosts get only the variables "
               "it is told to pass (Open MPI: -x TORCH_ADAPTER_AUTOINSTALL)",
    "mpirun": "MPI, as mpiexec",
    "orterun": "Open MPI, as mpiexec",
    "srun": "SLURM: one process per task; the job's environment is passed to every node by default",
}


def _console_script(name: str) -> Any:
    from importlib.metadata import entry_points

    found = list(entry_points(group="console_scripts", name=name))
    return found[0] if found else None


def find(command: str) -> tuple[str, Any] | None:
    """How ``command`` would run: ("console", entry point) or ("exec", path); None when it is not found."""
    if os.sep in command:
        return ("exec", command) if os.access(command, os.X_OK) and os.path.isfile(command) else None
    ep = _console_script(command)
    if ep is not None and shutil.which(command):
        return "console", ep
    path = shutil.which(command)
    return ("exec", path) if path else None


def _say(message: str) -> None:
    print(f"torch_adapter: {message}", file=sys.stderr, flush=True)


def run_launcher(argv: list[str], how: tuple[str, Any], settings: dict[str, Any], *, report: bool,
                 report_json: str | None) -> int:
    """Run ``argv`` (the launcher and its arguments) unadapted; its Python children adapted. Its exit code."""
    from ..core.config import CHILD_SETTINGS_ENV as ENV_VAR, encode_child_settings as encode
    from . import child_report as _child_report
    from .report import write

    name = os.path.basename(argv[0])
    kind, what = how
    if name not in LAUNCHERS and name not in RANK_LAUNCHERS:
        _say(f"{name!r} is not a launcher the adapter knows ({', '.join(LAUNCHERS)}). It runs unadapted; "
             f"the Python processes it starts in this environment are adapted (TORCH_ADAPTER_AUTOINSTALL); "
             f"programs that are not Python, or Python without torch_adapter installed, are not.")
    folder = _child_report.new_folder()
    old = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = encode({**settings, "announce": folder, "report": bool(report or report_json)})
    try:
        code = _run(argv, kind, what)
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old
    records = _child_report.collect(folder)
    _summarise(name, records)
    job, node = _node_job(name, argv, records, code)
    if report or report_json:
        write(records, report, report_json, job=job, node=node)
    shutil.rmtree(folder, ignore_errors=True)
    if job is not None and job["unadapted"]:
        from .job import EXIT_UNADAPTED

        for u in job["unadapted"]:
            _say(f"error: {u['label']} did not run adapted: {u['why']}. Fix: keep TORCH_ADAPTER_AUTOINSTALL in "
                 f"every rank's environment (a wrapper that clears it, `env -i`, another interpreter drop it), "
                 f"or launch `-m torch_adapter run` as each rank's program.")
        if code == 0:
            return EXIT_UNADAPTED
    return code


def _node_job(name: str, argv: list[str], records: list[dict[str, Any]],
              code: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """This node's ranks as a job report (launch/job.py) — None when the launcher started no ranks
    the adapter can count — and the node itself (the ``node`` entry of --report-json)."""
    from ..core.launcher_env import node_name
    from .job import build, expected_local, expected_tasks, missing_in_job, missing_on_node, rank_entry

    ranked = [rank_entry(r) for r in records if r.get("role") == "main"
              and (r.get("rank") is not None or (r.get("launch") or {}).get("local_rank") is not None)]
    expected = expected_local(argv) if (name in LAUNCHERS or name in RANK_LAUNCHERS) else None
    here = node_name()
    node = {"node": here, "launcher": name, "argv": list(argv), "expected_local_ranks": expected, "exit_code": code}
    if name == "srun":  # one srun starts every node's tasks: its ranks are the whole job, counted by global rank
        node["expected_ranks"] = total = expected_tasks(argv)
        if not ranked and total is None:
            return None, node
        return build(ranked, missing_in_job(ranked, total, name), whole_job=True), node
    if not ranked and expected is None:
        return None, node
    for r in ranked:
        r["node"] = r.get("node") or here
    return build(ranked, missing_on_node(ranked, expected, here, name), whole_job=False), node


def _run(argv: list[str], kind: str, what: Any) -> int:
    from .exit_guard import exit_code as _exit_code

    if kind == "exec":
        try:
            return subprocess.call([what, *argv[1:]])
        except KeyboardInterrupt:
            return 130
    old_argv = sys.argv[:]
    sys.argv = [argv[0], *argv[1:]]
    try:
        result = what.load()()
        return _exit_code(result)
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the launcher failed (torchrun: a rank did): as its own script ends
        _print_launcher_traceback(exc)  # the traceback its console script would print, then exit 1
        return 1
    finally:
        sys.argv = old_argv


def _print_launcher_traceback(exc: BaseException) -> None:
    """The launcher's uncaught exception as ``python -m LAUNCHER`` would show it: its frames, not the adapter's."""
    import traceback

    from ..core.tracebacks import user_traceback

    tb = user_traceback(exc.__traceback__)  # the project's one rule (TORCH_ADAPTER_TRACEBACKS=full shows all)
    print("".join(traceback.format_exception(type(exc), exc, tb)), end="", file=sys.stderr, flush=True)


def _summarise(name: str, records: list[dict[str, Any]]) -> None:
    from .child_report import alive, label

    if not records:
        _say(f"{name} started no adapted process: nothing ran on the adapter. The launcher itself runs unadapted; "
             f"its children are adapted only when they are Python processes of an interpreter with torch_adapter "
             f"installed, started with this environment (TORCH_ADAPTER_AUTOINSTALL kept). "
             f"Fix: launch the Python script directly (e.g. torchrun --nproc-per-node 2 -m torch_adapter run "
             f"train.py), or keep the environment for the children.")
        return
    workers = [r for r in records if r.get("role") == "DataLoader worker"]
    main = [r for r in records if r not in workers]
    running = [r for r in main if r.get("state") != "finished" and alive(r["pid"])]
    main = [r for r in main if r not in running]
    killed = [label(r) for r in main if str(r.get("state", "")).startswith("killed")]
    unfinished = [label(r) for r in main if r.get("state") != "finished" and label(r) not in killed]
    text = ", ".join(label(r) for r in main)
    extra = f" and {len(workers)} DataLoader worker(s)" if workers else ""
    _say(f"{name} ran unadapted; adapted {len(main)} process(es): {text}{extra}."
         + (f" Killed by SIGTERM (its report written at the signal): {', '.join(killed)}." if killed else "")
         + (f" Ended without an exit report (killed or crashed): {', '.join(unfinished)}." if unfinished else "")
         + (f" Still running (helpers): {', '.join(label(r) for r in running)}." if running else ""))
