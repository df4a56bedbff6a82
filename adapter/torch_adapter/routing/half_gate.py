"""The C++ float16 gate (``_half_gate.cpp``): the low-precision kernels' dtype test without a Python call.

:mod:`.low_precision` registers Python kernels for the heavy ops on the CPU key; without the gate
*every* call of those ops (float32 ones too) enters Python first (a 3x3 conv 9 -> 24 us, a small mm
3.6 -> 9 us, measured on an idle 2-core Xeon). The gate sits on top and calls the Python kernel only
for all-float16 calls; everything else goes straight to the CPU's own kernel.

Never built in the user's way: :func:`load` imports a finished build only (shipped in
``torch_adapter/_built`` by the install, or cached by ``torch-adapter build``). When there is none and
a compiler is here, :func:`ensure_built` starts one build in the background
(:func:`torch_adapter.core.cpp_build.build_in_background`: once per machine, source and torch version;
its log is ``<build folder>.log``) and this session keeps the Python kernels, which behave the same.
``TORCH_ADAPTER_HALF_GATE=python`` never builds or uses the gate;
``python -m torch_adapter.routing.half_gate --build`` builds it now (CI, images).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ..core.cpp_build import Part

__all__ = ["load", "build", "ensure_built", "is_built", "spawned", "ENV", "name", "PART"]

ENV = "TORCH_ADAPTER_HALF_GATE"  # "python": never the C++ gate
_SOURCE = Path(__file__).with_name("_half_gate.cpp")
PART = Part("half-gate", "torch_adapter_half_gate", _SOURCE, "the C++ float16 gate (float16 rewrite of the heavy ops)",
            fallback="the same float16 rewrite, but every call of the heavy ops (float32 too) enters Python "
                     "first (a small mm 3.6 -> 9 us)")
_LOCK = threading.Lock()
_EXT: Any = None


def name() -> str:
    return PART.name


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
    from ..core.cpp_build import _marker as marker

    return marker(name())


def ensure_built() -> str:
    """Start the background build unless the gate is built, being built, refused or unbuildable;
    returns what happened, for the session's log: "built", "building", "started", "off" or why not."""
    if os.environ.get(ENV) == "python":
        return "off"
    from ..core.cpp_build import stand_in_for

    return stand_in_for(PART, "Python kernels rewrite float16")


def spawned() -> subprocess.Popen | None:
    """The background build of the gate this process started, if any."""
    from ..core.cpp_build import background_builds

    return background_builds().get(name())


def _main(argv: list[str]) -> int:
    if argv != ["--build"]:
        print("usage: python -m torch_adapter.routing.half_gate --build", file=sys.stderr)
        return 2
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
