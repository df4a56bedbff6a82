"""The C++ dtype guard (``_dtype_guard.cpp``): the dtype check of a simulated target's
allocation ops without a Python call for supported dtypes.

Built at install or by ``torch-adapter build`` (:mod:`torch_adapter.core.cpp_build`: shipped in
``torch_adapter/_built`` or cached per source and torch version). Where there is no build,
:func:`load` starts one in the background for the next session and returns None: :mod:`.dtype_check`
registers Python kernels instead (same behaviour, a Python call per allocation). So does
``TORCH_ADAPTER_DTYPE_GUARD=python``. ``python -m torch_adapter.routing.dtype_guard --build`` pays the
compile now.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from ..core.cpp_build import Part

__all__ = ["load", "build", "is_built", "ENV", "PART"]

ENV = "TORCH_ADAPTER_DTYPE_GUARD"  # "python": never the C++ guard
_SOURCE = Path(__file__).with_name("_dtype_guard.cpp")
PART = Part("dtype-guard", "torch_adapter_dtype_guard", _SOURCE, "the C++ dtype guard (simulated targets)",
            fallback="the same checks, a Python call per tensor allocation of a simulated target")
_LOCK = threading.Lock()
_EXT: Any = None
_ERROR: str | None = None


def _name() -> str:
    return PART.name


def is_built() -> bool:
    from ..core.torch_private import is_extension_built

    return is_extension_built(_name())


def load(*, strict: bool = False) -> Any:
    """The extension module, or None: then the Python kernels are used. A finished build is imported;
    ``strict`` (``build()``) compiles one now; otherwise a missing one is built in the background."""
    global _EXT, _ERROR
    if os.environ.get(ENV) == "python" and not strict:
        return None
    with _LOCK:
        if _EXT is not None or (_ERROR is not None and not strict):
            return _EXT
        from ..core.torch_private import can_build_extensions, import_built_extension, load_extension

        _EXT = import_built_extension(_name())
        if _EXT is not None:
            return _EXT
        if not strict:
            from ..core.cpp_build import stand_in_for

            state = stand_in_for(PART, "Python kernels check dtypes")
            if state not in ("started", "building"):
                _ERROR = state
            return None
        try:
            if not can_build_extensions():
                raise RuntimeError("no C++ compiler ($CXX, else c++) or no ninja on this machine")
            print("torch_adapter: compiling the C++ dtype guard (once, then cached)...", file=sys.stderr, flush=True)
            _EXT = load_extension(_name(), _SOURCE)
        except Exception as exc:  # no compiler, a build error: the Python kernels do the same
            from ..errors import AdapterError, format_error

            _ERROR = format_error("torch_adapter.routing.dtype_guard (building the C++ dtype guard)",
                                  "a C++ compiler and ninja that build a torch extension",
                                  f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1:] or ''}",
                                  why="the allocation check of simulated targets is cheapest in C++",
                                  fix="install g++ and ninja; meanwhile Python kernels check dtypes (slower)")
            raise AdapterError(_ERROR) from exc
        return _EXT


def build() -> Path:
    """Compile (or load the cached) guard now; AdapterError when it cannot be built."""
    from ..core.torch_private import extension_build_dir

    load(strict=True)
    return extension_build_dir(_name())


if __name__ == "__main__":  # python -m torch_adapter.routing.dtype_guard --build
    if sys.argv[1:] != ["--build"]:
        sys.exit("usage: python -m torch_adapter.routing.dtype_guard --build")
    print(build())
