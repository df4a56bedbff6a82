"""What adapted child processes did, for the ``torch-adapter run`` that started them.

``run --report`` (and a launcher run, ``torch-adapter run accelerate launch …``) adds two
keys to the settings that ``TORCH_ADAPTER_AUTOINSTALL`` carries to child processes:
``announce`` (a private folder) and ``report`` (record ops). Every child the ``.pth`` hook
adapts writes ``<folder>/<pid>.json`` when it starts (so the parent knows what was
adapted) and again at exit with its label (``rank 0`` from ``RANK``, else from the process
group: the live one at exit, or the one it had — ``init_process_group`` is wrapped to note
the rank and world size when the default group comes up, so an ``mp.spawn`` worker that
destroys its group before returning keeps its rank; else ``pid N``), its routing log and
its redirects. The parent reads them back with
:func:`collect` and prints one report per process, labelled, plus the merged totals
(:func:`render`, :func:`merged_payload`). DataLoader workers are counted, not reported.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import tempfile
import time
from typing import Any

from ..core.patching import bindings

__all__ = ["CHILD_KEYS", "collect", "finish_now", "label", "merged_payload", "new_folder", "render", "start"]

# make_folder: the announce folder may not exist where the child runs (a Ray worker on another host,
# launch/ray_train.py): the child makes one of the same path there
CHILD_KEYS = ("announce", "report", "make_folder")
_THIS: dict[str, Any] = {}  # this process's record and its finish(), for finish_now()


def new_folder() -> str:
    return tempfile.mkdtemp(prefix="torch-adapter-run-")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    return int(raw) if raw is not None and raw.strip().isdigit() else None


def _group() -> tuple[int, int] | None:
    """(rank, world size) of this process's default process group, while it exists."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a label is never worth an error
        pass
    return None


def _rank_and_world(record: dict[str, Any]) -> tuple[int | None, int | None]:
    """``RANK``/``WORLD_SIZE`` (or another launcher's: ``OMPI_COMM_WORLD_RANK``, …, core/launcher_env.py),
    else the live process group, else the one noted at its init."""
    from ..core.launcher_env import ranks

    group = _group() or record.get("group")
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None:
        found = ranks()
        rank, world = found["rank"], found["world_size"]
    if rank is None and group:
        rank, world = group[0], world if world is not None else group[1]
    return rank, world


def _remember_group(session: Any, folder: str, record: dict[str, Any]) -> None:
    """Wrap ``init_process_group`` (each ``torch.distributed*`` module's binding of it, through
    the session's patcher) to note the rank and world size once the default group is up, and
    rewrite the announcement with them (a rank killed later is still named by its rank)."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from torch.distributed import distributed_c10d as c10d
    except Exception:  # noqa: BLE001 - no distributed in this torch: nothing to label by
        return
    current = c10d.init_process_group

    @functools.wraps(current)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = current(*args, **kwargs)
        group = _group()
        if group is not None:
            record["group"] = list(group)
            record["rank"], record["world_size"] = _rank_and_world(record)
            try:
                _write(folder, record)
            except Exception:  # noqa: BLE001 - instrumentation never breaks the user's init
                pass
        return out

    for module, name, _ in bindings(current, within="torch.distributed", name="init_process_group"):
        session.patcher.set(module, name, init_process_group)


def label(record: dict[str, Any]) -> str:
    """How reports name a process: ``rank R of W (pid P)`` in a multi-process job, else its pid
    (and role: a DataLoader worker, a helper)."""
    if record.get("rank") is not None:
        world = record.get("world_size")
        return f"rank {record['rank']}" + (f" of {world}" if world else "") + f" (pid {record['pid']})"
    return f"pid {record['pid']}" + (f" ({record['role']})" if record.get("role") not in (None, "main") else "")


def this_process() -> str | None:
    """This process's :func:`label` inside a multi-process job (torchrun, accelerate launch), else None."""
    rank, world = _rank_and_world({})
    if rank is None or not world or world == 1:
        return None
    return label({"rank": rank, "world_size": world, "pid": os.getpid()})


def _write(folder: str, record: dict[str, Any]) -> None:
    from ..core.safe_io import write_text

    write_text(os.path.join(folder, f"{record['pid']}.json"), json.dumps(record),
               call="torch_adapter: a child process's exit report")


def _role() -> str:
    try:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            return "DataLoader worker"
    except Exception:  # noqa: BLE001
        pass
    return "main"


def start(options: dict[str, Any], session: Any) -> None:
    """In an adapted child: announce it, record its ops if asked, and write the report at exit."""
    folder = options.get("announce")
    if folder and options.get("make_folder"):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:  # no record here then; the process still runs adapted
            pass
    if not folder or not os.path.isdir(folder):
        return
    from ..core.launcher_env import ranks

    started = time.monotonic()
    record: dict[str, Any] = {"pid": os.getpid(), "ppid": os.getppid(), "argv": list(sys.argv), "state": "started",
                              "rank": None, "role": "main", "target": session.target.label, "launch": ranks()}
    if record["launch"]["launcher"] is not None:  # a launcher's rank: named so even if it never reports at exit
        record["rank"], record["world_size"] = _rank_and_world(record)
    _write(folder, record)
    _remember_group(session, folder, record)
    tracer = log = None
    if options.get("report"):
        from ..routing.trace import trace
        from . import hang

        tracer = trace(use_observer=False)
        log = tracer.__enter__()
        session.closers.append(hang.enable_flight_recorder())  # before the program makes its groups

    ended: list[str] = []

    def finish(state: str = "finished") -> None:
        if ended or not os.path.isdir(folder):  # ended already (finish_now), or the run that asked has ended
            return
        ended.append(state)
        try:
            if tracer is not None:
                tracer.__exit__(None, None, None)
            if "hang" not in record and log is not None:  # a collective that failed and ended the program
                from .hang import facts

                failed = facts(exc=getattr(sys, "last_value", None))
                if failed is not None:
                    record["hang"] = failed
            rank, world = _rank_and_world(record)
            record.update(state=state, argv=list(sys.argv), rank=rank, role=_role(), world_size=world,
                          seconds=round(time.monotonic() - started, 3))
            if log is not None and record["role"] == "main":
                record["routing"] = log.to_dict()
                record["redirects"] = session.redirect_log.to_json()["entries"]
            _write(folder, record)
        except Exception as exc:  # noqa: BLE001 - instrumentation never breaks the user's exit
            print(f"torch_adapter: could not write this process's report ({type(exc).__name__}: {exc})",
                  file=sys.stderr)

    atexit.register(finish)
    _THIS.update(record=record, finish=finish)
    if options.get("report"):
        from .hang import watch_sigterm

        def killed(found: dict[str, Any]) -> None:  # the launcher ends this rank: say where it was
            record["hang"] = found
            atexit.unregister(finish)
            finish("killed (SIGTERM)")

        session.closers.append(watch_sigterm(killed, os.path.join(folder, f"{os.getpid()}.stack")))


def finish_now(state: str = "finished", **facts: Any) -> dict[str, Any] | None:
    """End this adapted process's record now, as at its exit (its ops so far, ``state``, ``facts`` such as
    ``launch``), and return it; None when this process has no record. For workers whose launcher ends them
    without ``atexit`` (Ray kills its train workers: launch/ray_train.py)."""
    finish = _THIS.pop("finish", None)
    if finish is None:
        return None
    atexit.unregister(finish)
    _THIS["record"].update(facts)
    finish(state)
    return dict(_THIS["record"])


def collect(folder: str) -> list[dict[str, Any]]:
    """The records the children wrote, ranks first (in order), then by pid."""
    from .hang import read_stack_file

    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as fh:
                    record = json.load(fh)
            except (OSError, ValueError):
                continue
            if record.get("state") == "started" and "hang" not in record:  # killed inside C: faulthandler's stack
                stack = read_stack_file(os.path.join(folder, f"{record.get('pid')}.stack"))
                if stack is not None:
                    record["hang"] = stack
            out.append(record)
    return sorted(out, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r["pid"]))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reported(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "routing" in r]


def merged_payload(records: list[dict[str, Any]], parent: dict[str, Any] | None = None) -> dict[str, Any]:
    """One routing log (schema torch-adapter.routing-log) over the parent and every child, plus per process."""
    from ..routing.log import RoutingLog

    logs = [RoutingLog.from_dict(r["routing"]) for r in reported(records)]
    if parent and parent.get("ops"):
        logs.insert(0, RoutingLog.from_dict({k: v for k, v in parent.items() if k != "redirects"}))
    merged = RoutingLog(logs[0].target, logs[0].simulated, logs[0].emulated) if logs else RoutingLog()
    for one in logs:
        merged.merge(one)
    payload = merged.to_dict()
    payload["redirects"] = [*(parent or {}).get("redirects", []),
                            *({**e, "process": label(r)} for r in reported(records) for e in r.get("redirects", []))]
    payload["processes"] = [{"label": label(r), **{k: r.get(k) for k in ("pid", "rank", "role", "argv", "state")},
                             "summary": r.get("routing", {}).get("summary"), **_launch_facts(r)} for r in records]
    return payload


def _launch_facts(record: dict[str, Any]) -> dict[str, Any]:
    """Where a child ran in its job (launcher, node, local rank) and its time: the ``processes`` row's extra keys."""
    launch = record.get("launch") or {}
    return {"world_size": record.get("world_size"), "seconds": record.get("seconds"),
            **{k: launch.get(k) for k in ("launcher", "node", "node_rank", "local_rank", "local_world_size")}}


def _recorded_redirects(rows: list[dict[str, Any]]) -> Any:
    """A RedirectLog over rows a child wrote (its ``to_json()["entries"]``), for rendering."""
    from dataclasses import fields

    from ..redirect.log import RedirectEntry, RedirectLog

    names = {f.name for f in fields(RedirectEntry)}
    entries = [RedirectEntry(**{k: v for k, v in row.items() if k in names}) for row in rows]

    class Recorded(RedirectLog):
        def entries(self) -> list[RedirectEntry]:
            return entries

    return Recorded()


def render(records: list[dict[str, Any]], console: Any) -> None:
    """One labelled report per child that recorded ops, then the totals over all of them."""
    from ..routing.log import RoutingLog, counts_text

    shown = reported(records)
    total = RoutingLog()
    for r in shown:
        console.print(_recorded_redirects(r.get("redirects", [])).render(f"torch_adapter {label(r)}: redirected to {r.get('target', '?')}"))
        log = RoutingLog.from_dict(r["routing"])
        total.merge(log)
        console.print(f"[bold]{label(r)}[/bold]: routing")
        console.print(log)
    if len(shown) > 1:
        console.print(f"torch_adapter: all {len(shown)} processes together: {counts_text(total.summary())} op calls")
