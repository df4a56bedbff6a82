"""``torch_adapter.memory``: memory per device, the largest live tensors, and where they were made.

::

    torch_adapter.memory.track(True)            # opt-in: remember where large tensors are created
    ... train ...
    report = torch_adapter.memory.stats()       # a MemoryReport
    print(report)                                # per device: allocated / reserved / peaks; largest tensors
    report.to_dict()                             # JSON-able (schema torch-adapter.memory, version 1)

Per device:

- the host (``cpu``): the process's figures from :mod:`torch_adapter.redirect.host_memory`
  — the same ones ``torch.cuda.memory_*`` answer on the CPU target (heap in use as
  *allocated*, resident set as *reserved*, their peaks);
- a real accelerator target: ``torch.<device>.memory_allocated / memory_reserved /
  max_memory_*`` for each of its devices (MPS: current and driver-allocated, no peaks).

**Largest live tensors** are found by walking the objects the garbage collector tracks
(tensors referenced from Python; tensors only C++ holds, such as those autograd saved for
backward, are not seen), grouped by storage, largest first. With tracking on, each storage
created since carries its creation site: the user's file:line, the op and the module path.
Tracking runs every op of the enabling thread through Python (the shared debug dispatch
mode, :mod:`torch_adapter.tools.tool_mode`); it is for diagnosis, not for production.

Another process can read these figures with ``torch-adapter memory --pid PID`` when it was
adapted with ``install(memory_server=True)`` or ``TORCH_ADAPTER_MEMORY_SERVER=1``
(:mod:`torch_adapter.tools.memory_server`).
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from . import tool_mode as _tool_mode
from ..errors import UsageError, format_error

__all__ = ["stats", "track", "tracking", "MemoryReport", "SCHEMA", "VERSION"]

SCHEMA = "torch-adapter.memory"
VERSION = 1
_MAX_SITES = 20000
_SITES: dict[tuple[str, int], dict[str, Any]] = {}
_CLOSING: "weakref.WeakSet[Any]" = weakref.WeakSet()


# -- tracking -------------------------------------------------------------------------------------
class _Tracker:
    """Records the creation site of each new storage of at least ``min_bytes``."""

    def __init__(self, min_bytes: int) -> None:
        self.min_bytes = min_bytes

    def before(self, func: Any, args: tuple, kwargs: dict) -> None:
        return None

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any, state: Any) -> None:
        from ..core.callsite import user_site
        from .numerics import tensors

        new = []
        for _, t in tensors(out):
            storage = _storage(t)
            if storage is not None and storage[1] >= self.min_bytes:
                new.append((t, storage))
        if not new:
            return
        inputs = {_storage(t)[0] for _, t in tensors((args, kwargs)) if _storage(t) is not None}
        for t, (key, _size) in new:
            if key in inputs:  # a view or an in-place result: not a new storage
                continue
            _SITES.pop(key, None)
            _SITES[key] = {"site": user_site(), "op": func.name(), "module": _tool_mode.module_path(),
                           "shape": list(t.shape), "dtype": str(t.dtype).rpartition(".")[2], "time": time.time()}
            if len(_SITES) > _MAX_SITES:
                del _SITES[next(iter(_SITES))]


def _storage(t: Any) -> tuple[tuple[str, int], int] | None:
    """((device, storage address), storage bytes) of a plain strided tensor, else None."""
    import torch

    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        s = t.untyped_storage()
        return (str(t.device), s.data_ptr()), s.nbytes()
    except (RuntimeError, NotImplementedError):  # storage-less tensors (functional wrappers, ...)
        return None


def track(enabled: bool = True, *, min_bytes: int = 1 << 20) -> None:
    """Turn creation-site tracking of tensors of at least ``min_bytes`` (default 1 MiB) on or off.

    On, every op of this thread passes through Python (slower); off again at the session's
    ``uninstall()`` if a session was installed when it was turned on.
    """
    if not isinstance(enabled, bool):
        raise UsageError(format_error("torch_adapter.memory.track(enabled)", "True or False",
                                      f"{enabled!r} ({type(enabled).__name__})", fix="track(True)"))
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise UsageError(format_error("torch_adapter.memory.track(min_bytes=...)", "an int >= 0 (bytes)",
                                      f"{min_bytes!r}", fix="e.g. track(True, min_bytes=1 << 20)"))
    if not enabled:
        _tool_mode.disable("memory_tracking")
        _SITES.clear()  # a site is only trusted while tracking: freed memory gets reused
        return
    _tool_mode.enable("memory_tracking", _Tracker(min_bytes))
    from ..core.state import current

    session = current()
    if session is not None and session not in _CLOSING:
        _CLOSING.add(session)
        session.closers.append(lambda: _tool_mode.disable("memory_tracking"))


def tracking() -> bool:
    """Is creation-site tracking on?"""
    return _tool_mode.enabled("memory_tracking")


# -- figures ---------------------------------------------------------------------------------------
def _host_row() -> dict[str, Any]:
    from ..redirect import host_memory as hm

    return {"device": "cpu", "allocated": hm.allocated(), "reserved": hm.reserved(),
            "peak_allocated": hm.peak_allocated() if hm.peak_tracked() else None,  # None: not tracked
            "peak_reserved": hm.peak_reserved(),
            "source": "process heap (mallinfo2) / resident set (VmRSS); peaks from the kernel's VmHWM"}


def _device_rows(target: Any) -> list[dict[str, Any]]:
    import torch

    kind = target.device_type
    if kind == "cpu" or target.simulated:
        return []
    api = getattr(torch, kind, None)
    rows: list[dict[str, Any]] = []
    if kind == "mps" and api is not None:
        return [{"device": "mps", "allocated": int(api.current_allocated_memory()),
                 "reserved": int(api.driver_allocated_memory()), "peak_allocated": None, "peak_reserved": None,
                 "source": "torch.mps.current_allocated_memory / driver_allocated_memory"}]
    needed = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")
    if api is None or not all(hasattr(api, n) for n in needed):
        return [{"device": kind, "allocated": None, "reserved": None, "peak_allocated": None, "peak_reserved": None,
                 "source": f"torch.{kind} has no memory_allocated/memory_reserved API"}]
    for i in range(max(int(target.device_count), 1)):
        rows.append({"device": f"{kind}:{i}", "allocated": int(api.memory_allocated(i)),
                     "reserved": int(api.memory_reserved(i)), "peak_allocated": int(api.max_memory_allocated(i)),
                     "peak_reserved": int(api.max_memory_reserved(i)),
                     "source": f"torch.{kind}.memory_* (caching allocator)"})
    return rows


def _largest(top: int) -> list[dict[str, Any]]:
    import torch

    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(), not isinstance: no __class__ lookups
            continue
        info = _storage(obj)
        if info is None or info[1] == 0:
            continue
        key, nbytes = info
        g = groups.get(key)
        if g is None:
            groups[key] = {"bytes": nbytes, "device": key[0], "shape": list(obj.shape),
                           "dtype": str(obj.dtype).rpartition(".")[2], "tensors": 1,
                           "parameter": isinstance(obj, torch.nn.Parameter)}
        else:
            g["tensors"] += 1
            g["parameter"] = g["parameter"] or isinstance(obj, torch.nn.Parameter)
            if obj.numel() * obj.element_size() == nbytes:  # the tensor spanning the storage names it
                g["shape"] = list(obj.shape)
    rows = sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])[:top]
    out = []
    on = tracking()
    for key, g in rows:
        made = _SITES.get(key) if on else None
        out.append({**g, "site": made.get("site") if made else None, "op": made.get("op") if made else None,
                    "module": made.get("module") if made else None})
    return out


@dataclass
class MemoryReport:
    """What :func:`stats` returns: per-device rows and the largest live tensors. Plain data."""

    pid: int
    target: str
    devices: list[dict[str, Any]]
    largest: list[dict[str, Any]] = field(default_factory=list)
    tracking: bool = False
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": VERSION, "pid": self.pid, "target": self.target, "time": self.time,
                "tracking": self.tracking, "devices": self.devices, "largest": self.largest}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MemoryReport":
        if data.get("schema") != SCHEMA or data.get("version") != VERSION:
            raise UsageError(format_error("MemoryReport.from_dict()", f"schema {SCHEMA!r} version {VERSION}",
                                          f"schema {data.get('schema')!r} version {data.get('version')!r}",
                                          fix="pass the output of MemoryReport.to_dict()"))
        return cls(int(data["pid"]), str(data.get("target", "")), list(data["devices"]), list(data.get("largest", [])),
                   bool(data.get("tracking")), float(data.get("time", 0.0)))

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        # Narrow enough for a notebook's output beside a side panel (WIDTH): where the figures
        # come from is a caption, wrapped under the table, not a column.
        dev = Table(title=f"torch_adapter memory: pid {self.pid}, target {self.target}",
                    caption="; ".join(f"{r['device']}: {r['source']}" for r in self.devices if r.get("source")),
                    caption_justify="left")
        for col in ("device", "allocated", "reserved", "peak allocated", "peak reserved"):
            dev.add_column(col, justify="left" if col == "device" else "right")
        for r in self.devices:
            dev.add_row(r["device"], _fmt(r["allocated"]), _fmt(r["reserved"]), _fmt(r["peak_allocated"]),
                        _fmt(r["peak_reserved"]))
        devices = sorted({t["device"] for t in self.largest})
        big = Table(title="largest live tensors (by storage" + (f", on {devices[0]}" if len(devices) == 1 else "")
                    + ")" + ("" if self.tracking else " — creation sites need memory.track(True)"))
        big.add_column("size", justify="right", no_wrap=True)
        big.add_column("tensor", no_wrap=True)
        big.add_column("created at", overflow="fold")  # wrapped at spaces, long names folded
        big.add_column("by (op in module)", overflow="fold")
        for t in self.largest:
            site = t.get("site")
            where = _where(site) if site else ("parameter" if t.get("parameter") else "-")
            on = f" {t['device']}" if len({x["device"] for x in self.largest}) > 1 else ""  # else: the title says
            big.add_row(_fmt(t["bytes"]), f"{tuple(t['shape'])} {t['dtype']}{on}", where,
                        " in ".join(x for x in (t.get("op"), t.get("module")) if x))
        return Group(dev, big)

    def render(self, width: int = 88) -> str:
        """The tables as text, ``width`` columns wide (88: a notebook's output area fits it with a
        side panel open; ``torch-adapter memory`` passes the terminal's width)."""
        from rich.console import Console

        with open(os.devnull, "w") as sink:
            console = Console(width=width, record=True, file=sink, color_system=None, force_jupyter=False)
            console.print(self)
        return console.export_text()

    def __str__(self) -> str:
        return self.render()


def _where(site: dict[str, Any]) -> str:
    """``cell [8], line 3`` for a notebook cell, else the short file name and line (and the
    library line the call went through, relative to site-packages)."""
    from ..core.callsite import cell_of, short_path, site_text

    file = str(site.get("file"))
    if site.get("cell") is not None or cell_of(file) is not None or short_path(file) != file:
        return site_text(site)
    return site_text({**site, "file": _short(file)})


def _short(path: str) -> str:
    """A file name short enough for a table cell: relative to the working directory, or its
    last two parts (the JSON keeps the full path)."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    if not rel.startswith(".."):
        return rel
    parts = path.split(os.sep)
    return os.sep.join(["...", *parts[-2:]]) if len(parts) > 2 else path


def _fmt(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def stats(top: int = 10) -> MemoryReport:
    """Memory per device now, and the ``top`` largest live tensors (0: skip the walk)."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise UsageError(format_error("torch_adapter.memory.stats(top=...)", "an int >= 0", f"{top!r}",
                                      fix="e.g. stats(top=10)"))
    from ..core.state import current
    from ..routing.target import resolve

    session = current()
    target = session.target if session is not None else resolve("auto")
    if top:
        import gc

        gc.collect()  # tensors only kept alive by reference cycles are not live: drop them first
    return MemoryReport(os.getpid(), target.label, [_host_row(), *_device_rows(target)],
                        _largest(top) if top else [], tracking(), time.time())
