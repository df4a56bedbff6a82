"""Real memory figures for the CPU target, in the shape torch.cuda's memory API returns.

The CPU has no caching allocator, so CUDA's counters are answered from the process:

- *allocated*: bytes in use through malloc (glibc ``mallinfo2``: ``uordblks + hblkhd``),
  tensors and everything else the process holds on its heap;
- *reserved*: the resident set size (``VmRSS``);
- *peak reserved*: ``VmHWM``, the kernel's high-water mark of the resident set, reset by
  ``reset_peak_memory_stats()`` (``/proc/self/clear_refs``) and when the adapter is first
  installed;
- *peak allocated*: a real peak since the last reset, kept by the kernel at every page the
  process touches: the heap in use at the reset plus how far the resident set rose above its
  size at the reset (``VmHWM`` − ``VmRSS`` then), and never below the current value. So a
  tensor made and freed between two queries counts; memory allocated but never written
  (``torch.empty`` left untouched) does not, as it takes no RAM. Where the kernel keeps no
  resettable high-water mark (no ``/proc/self/clear_refs``: off Linux, some sandboxes) the
  peak is *not tracked*: ``max_memory_allocated()`` raises ``UnsupportedCudaFeature`` saying
  so, and ``memory_stats()`` has no ``.peak`` keys — never a number that only looks like one;
- ``empty_cache()`` returns freed heap pages to the system (``malloc_trim``).

Off Linux/glibc the current figures fall back to psutil's RSS. docs/redirect.md has the table.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

__all__ = ["allocated", "reserved", "peak_reserved", "reset_peak", "empty_cache", "mem_info",
           "stats", "summary"]

_lock = threading.Lock()
_base: tuple[int, int] | None = None  # (allocated, resident) at the last reset; None: peak not tracked


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _rss() -> int:
    value = _proc_status("VmRSS")
    if value is not None:
        return value
    import psutil

    return int(psutil.Process().memory_info().rss)


def allocated() -> int:
    if _LIBC is not None:
        info = _LIBC.mallinfo2()
        return int(info.uordblks + info.hblkhd)
    return _rss()


def peak_tracked() -> bool:
    """Is a real peak kept (a resettable kernel high-water mark)?"""
    return _base is not None


def peak_allocated() -> int:
    """The peak of :func:`allocated` since the last reset (see the module docstring)."""
    with _lock:
        base = _base
    now = allocated()
    hwm = _proc_status("VmHWM")
    if base is None or hwm is None:
        from ..errors import UnsupportedCudaFeature, format_error

        raise UnsupportedCudaFeature(format_error(
            "torch.cuda.max_memory_allocated() on the CPU target", "a peak kept since the last reset",
            "no resettable high-water mark on this system (no writable /proc/self/clear_refs)",
            why="the CPU allocator keeps no peak; torch_adapter reports the kernel's, and would rather say "
                "it has none than return a number that only looks like a peak",
            fix="use torch.cuda.memory_allocated() (current) or max_memory_reserved() (peak resident set)"))
    return max(now, base[0] + max(0, hwm - base[1]))


def reserved() -> int:
    return _rss()


def peak_reserved() -> int:
    value = _proc_status("VmHWM")
    return value if value is not None else _rss()


def reset_peak() -> None:
    """Start both peaks again from now (the kernel's high-water mark included)."""
    global _base
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current resident set
        tracked = _proc_status("VmHWM") is not None
    except OSError:
        tracked = False
    with _lock:
        _base = (allocated(), _rss()) if tracked else None


def empty_cache() -> None:
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of RAM, like torch.cuda.mem_get_info()."""
    try:
        fields = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, rest = line.split(":", 1)
                fields[key] = int(rest.split()[0]) * 1024
        return fields["MemAvailable"], fields["MemTotal"]
    except (OSError, KeyError):
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)


def total() -> int:
    return mem_info()[1]


def stats() -> dict[str, Any]:
    """A subset of torch.cuda.memory_stats() keys, filled from the process."""
    a, r, pr = allocated(), reserved(), peak_reserved()
    pa = peak_allocated() if peak_tracked() else None
    out: dict[str, Any] = {}
    for pool in ("all", "large_pool", "small_pool"):
        scale = 1 if pool == "all" else 0
        out[f"allocated_bytes.{pool}.current"] = a * scale
        out[f"reserved_bytes.{pool}.current"] = r * scale
        out[f"reserved_bytes.{pool}.peak"] = pr * scale
        out[f"active_bytes.{pool}.current"] = a * scale
        if pa is not None:  # not tracked: no number that only looks like a peak
            out[f"allocated_bytes.{pool}.peak"] = pa * scale
            out[f"active_bytes.{pool}.peak"] = pa * scale
    out.update({"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0, "num_device_free": 0,
                "torch_adapter.source": "process heap (mallinfo2) and RSS; peak allocated from the kernel's "
                                        "high-water mark (VmHWM) since the last reset"
                                        + ("" if pa is not None else " (not tracked here)")
                                        + "; see docs/redirect.md"})
    return out


def summary() -> str:
    mib = 1024 * 1024
    s = stats()
    return "\n".join([
        "|" + "=" * 60 + "|",
        "|  torch_adapter: CPU target memory summary (process-wide)".ljust(61) + "|",
        "|" + "-" * 60 + "|",
        f"|  Allocated (heap in use)  current {s['allocated_bytes.all.current'] / mib:10.1f} MiB  "
        + (f"peak {s['allocated_bytes.all.peak'] / mib:10.1f} MiB" if "allocated_bytes.all.peak" in s
           else "peak not tracked"),
        f"|  Reserved  (resident)     current {s['reserved_bytes.all.current'] / mib:10.1f} MiB  "
        f"peak {s['reserved_bytes.all.peak'] / mib:10.1f} MiB",
        "|" + "=" * 60 + "|",
    ])


def pid_info() -> dict[str, Any]:
    return {"pid": os.getpid(), "allocated": allocated(), "reserved": reserved()}


reset_peak()  # imported when the adapter is installed: peaks count from then (CUDA: from program start)
