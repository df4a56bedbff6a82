"""The C++ float16 gate (``_half_gate.cpp``): the low-precision kernels' dtype test without a Python call.

:mod:`.low_precision` registers Python kernels for the heavy ops on the CPU key; without the gate
*every* call of those ops (float32 ones too) enters Python first (a 3x3 conv 9 -> 24 us, a small mm
3.6 -> 9 us, measured on an idle 2-core Xeon). The gate sits on top and calls the Python kernel only
for all-float16 calls; everything else goes straight to the CPU's own kernel.

Never built in the user's way: :func:`load` imports a finished build only. When there is none and
a compiler is here, :func:`ensure_built` starts one build in a detached background process (once per
machine, source and torch version; a marker file keeps concurrent sessions from starting another;
its log is ``<build folder>.log``) and this session keeps the Python kernels, which behave the same.
``TORCH_ADAPTER_HALF_GATE=python`` never builds or uses the gate;
``python -m torch_adapter.routing.half_gate --build`` builds it now (CI, images).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["load", "build", "ensure_built", "is_built", "ENV", "name"]

ENV = "TORCH_ADAPTER_HALF_GATE"  # "python": never the C++ gate
_SOURCE = Path(__file__).with_name("_half_gate.cpp")
_STALE_S = 20 * 60  # a build marker older than this belongs to a build that died
_LOCK = threading.Lock()
_EXT: Any = None
_SPAWNED: subprocess.Popen | None = None


def name() -> str:
    from ..core.torch_private import extension_name

    return extension_name("torch_adapter_half_gate", _SOURCE)


def is_built() -> bool:
    from ..core.torch_private import is_extension_built

    return is_extension_built(name())


def load() -> Any:
    """The gate's module when a finished build is here (imported, never compiled), else None."""
    global _EXT
    if os.environ.get(ENV) == "python":
        return None
    with _LOCK:
        if _EXT is None:
            from ..core.torch_private import import_built_extension

            _EXT = import_built_extension(name())
        return _EXT


def build() -> Path:
    """Compile (or load the cached) gate now; AdapterError when it cannot be built."""
    global _EXT
    from ..core.torch_private import can_build_extensions, extension_build_dir, load_extension
    from ..errors import AdapterError, format_error

    with _LOCK:
        try:
            if not can_build_extensions() and not is_built():
                raise RuntimeError("no C++ compiler ($CXX, else c++) or no ninja on this machine")
            _EXT = load_extension(name(), _SOURCE)
        except Exception as exc:
            raise AdapterError(format_error(
                "torch_adapter.routing.half_gate.build()", "a C++ compiler and ninja that build a torch extension",
                f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}",
                why="the float16 gate keeps float32 calls of the heavy ops out of Python",
                fix="install g++ and ninja; meanwhile the Python kernels do the same, slower")) from exc
    return extension_build_dir(name())


def _marker() -> Path:
    from ..core.torch_private import extension_build_dir

    directory = extension_build_dir(name())
    return directory.with_name(directory.name + ".building")


def ensure_built() -> str:
    """Start the background build unless the gate is built, being built, refused or unbuildable;
    returns what happened, for the session's log: "built", "building", "started", "off" or why not."""
    global _SPAWNED
    if os.environ.get(ENV) == "python":
        return "off"
    if is_built():
        return "built"
    from ..core.torch_private import can_build_extensions

    if not can_build_extensions():
        return "no C++ compiler or no ninja"
    marker = _marker()
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        if marker.exists() and time.time() - marker.stat().st_mtime > _STALE_S:
            marker.unlink(missing_ok=True)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return "building"
    except OSError as exc:  # a read-only or full cache folder, a file in its place: the Python kernels serve
        return f"cannot write {marker.parent}: {exc.strerror or exc}"
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    log = open(marker.with_suffix(".log"), "w")  # noqa: SIM115 - the child owns it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MAX_JOBS": "1"}
    try:
        code = f"import sys; from {__name__} import _main; sys.exit(_main(sys.argv[1:]))"  # (-m warns: imported by its package)
        _SPAWNED = subprocess.Popen([sys.executable, "-c", code, "--build", "--marker", str(marker)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, close_fds=True)
    except OSError as exc:
        marker.unlink(missing_ok=True)
        return f"cannot start the build: {exc}"
    finally:
        log.close()
    return "started"


def _main(argv: list[str]) -> int:
    marker = Path(argv[argv.index("--marker") + 1]) if "--marker" in argv else None
    if "--build" not in argv:
        print("usage: python -m torch_adapter.routing.half_gate --build", file=sys.stderr)
        return 2
    try:
        if marker is not None:
            os.nice(10)  # a background build yields to the session that started it
        print(build())
        return 0
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
