"""The ranks a notebook cell forks (``accelerate.notebook_launcher``, ``torch.multiprocessing.start_processes``
with ``start_method="fork"``, ``os.fork``), shown in that cell as one job report (launch/job.py).

A forked rank inherits the kernel's adapter, its patches and the cell's routing trace; it never
runs the kernel's ``post_run_cell``, so without this its routes are seen by nobody. While a cell
runs, :class:`ForkedRanks` holds a folder; Python's at-fork hook (``os.register_at_fork``, registered
once per kernel: it cannot be taken back, so it does nothing once no cell holds a folder) starts, in
each forked child, a fresh trace of its own and writes the child's record into the folder when it
ends — at ``multiprocessing``'s exit (``util._exit_function`` runs its finalizers; a forked
``Process`` ends by ``os._exit`` without ``atexit``) or at ``atexit`` (a plain ``os.fork`` child that
exits normally). After the cell, the records of ranks (a launcher's ``RANK``, or a process group)
become the job report — per rank routes, fallbacks, bytes copied, the suspected stragglers — shown
under the cell (text and HTML) and kept as ``router.last_job``. A child that could not record says so
on its stderr and goes on (instrumentation never breaks the user's code).

``subprocess`` children are not forks in this sense (``_posixsubprocess`` runs no Python at-fork hook);
``spawn``-started ranks are new interpreters that do not inherit the kernel's adapter at all (the
launcher's own environment decides, docs/launchers.md).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

__all__ = ["ForkedRanks", "show"]

_ACTIVE: list[ForkedRanks] = []  # the one whose cell is running (a list: set and cleared without `global`)
_HOOKED = [False]


def _after_fork_in_child() -> None:
    if _ACTIVE:
        _ACTIVE[0]._in_child()


class ForkedRanks:
    """One kernel's forked-rank records, a folder per running cell."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.folder: str | None = None
        self.last_job: dict[str, Any] | None = None
        self._child_finish: Any = None  # in a forked child: writes its record
        from multiprocessing import util

        # a multiprocessing child clears the finalizers it inherited (and any the at-fork hook made)
        # before it runs these: the record's finalizer is made again here
        util.register_after_fork(self, ForkedRanks._after_multiprocessing_fork)

    # -- in the kernel ----------------------------------------------------------------------------
    def cell_started(self) -> None:
        self.cell_ended()
        self.folder = tempfile.mkdtemp(prefix="torch-adapter-cell-ranks-")
        if not _HOOKED[0]:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _HOOKED[0] = True
        _ACTIVE[:] = [self]

    def cell_ended(self) -> dict[str, Any] | None:
        """The job report of the ranks the cell forked (None when it forked none), its folder removed."""
        folder, self.folder = self.folder, None
        if _ACTIVE and _ACTIVE[0] is self:
            _ACTIVE.clear()
        if folder is None:
            return None
        try:
            from ..launch.child_report import collect
            from ..launch.job import build, rank_entry

            records = [r for r in collect(folder) if r.get("rank") is not None and r.get("role") == "main"]
            if not records:
                return None
            job = build([rank_entry(r) for r in records], [])
            self.last_job = job
            return job
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        self.cell_ended()

    # -- in a forked child ----------------------------------------------------------------------------
    def _in_child(self) -> None:
        folder = self.folder
        if folder is None:
            return
        try:
            self._start_child(folder)
        except Exception as exc:  # noqa: BLE001 - a failing observer reports itself; the child goes on
            print(f"torch_adapter: this forked process's routing is not recorded ({type(exc).__name__}: {exc})",
                  file=sys.stderr)

    def _start_child(self, folder: str) -> None:
        import atexit
        from multiprocessing import util

        from ..core.launcher_env import ranks
        from ..launch.child_report import _rank_and_world, _role, _write
        from ..session import current

        session = current()
        router = self.router
        router._stop()  # the kernel's cell trace, inherited: this process's ops are its own from here
        from ..routing.trace import trace

        router._tracer = tracer = trace()
        router._log = log = tracer.__enter__()
        started, pid = time.monotonic(), os.getpid()
        done = [False]

        def finish() -> None:
            if done[0] or os.getpid() != pid or not os.path.isdir(folder):
                return
            done[0] = True
            try:
                tracer.__exit__(None, None, None)
                record: dict[str, Any] = {"pid": pid, "ppid": os.getppid(), "role": "main", "state": "finished",
                                          "launch": ranks(), "seconds": round(time.monotonic() - started, 3),
                                          "target": session.target.label if session is not None else None,
                                          "routing": log.to_dict()}
                record["rank"], record["world_size"] = _rank_and_world(record)
                if record["rank"] is None or _role() != "main":
                    return  # a fork that is not a rank (a rank's DataLoader worker, a helper): not the job's
                _write(folder, record)  # the same record file a launched child writes
            except Exception as exc:  # noqa: BLE001 - instrumentation never breaks the user's exit
                print(f"torch_adapter: could not write this forked rank's record ({type(exc).__name__}: {exc})",
                      file=sys.stderr)

        self._child_finish = finish
        util.Finalize(None, finish, exitpriority=100)  # a multiprocessing child: run before os._exit
        atexit.register(finish)

    def _after_multiprocessing_fork(self) -> None:
        if self._child_finish is not None:
            from multiprocessing import util

            util.Finalize(None, self._child_finish, exitpriority=100)


def show(job: dict[str, Any]) -> None:
    """The job report under the cell: rich's rendering as text and as HTML (inline styles)."""
    from IPython.display import display
    from rich.console import Console

    from ..launch.job import render

    console = Console(record=True, width=120, file=open(os.devnull, "w"), force_terminal=False)  # noqa: SIM115
    try:
        render(job, console, title="torch_adapter: the ranks this cell launched")
        text = console.export_text(clear=False)
        html = console.export_html(inline_styles=True)
    finally:
        console.file.close()
    display({"text/plain": text, "text/html": html,
             "application/vnd.torch-adapter.job+json": job}, raw=True)
