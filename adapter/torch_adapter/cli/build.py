"""``torch-adapter build [--only PART ...] [--verbose]``: compile every C++ part of the adapter now.

Each part is a torch extension built once per torch version and source, then cached
(``torch.utils.cpp_extension``'s folder): the op observer (per-cell routing reports), the dtype
guard (simulated targets' allocation check), the float16 gate (the float16 rewrite of the heavy
ops) and the emulated npu device. The install runs this already (``hatch_build.py``: ``--into`` the
package's ``_built`` folder); without any build a program or notebook cell is never made to wait:
the first three have pure-Python stand-ins while a background build runs, the emulated device is
compiled when asked for (:mod:`torch_adapter.core.cpp_build`).
Exit codes: 0 every part built (or already was); 1 a part failed (its error, one line each); 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

__all__ = ["register", "run", "PARTS"]


# name -> (what it is, its module, whether its build() takes verbose=)
PARTS: dict[str, tuple[str, str, bool]] = {
    "observer": ("the C++ op observer (per-cell routing reports)", "torch_adapter.routing.observe", True),
    "dtype-guard": ("the C++ dtype guard (simulated targets)", "torch_adapter.routing.dtype_guard", False),
    "half-gate": ("the C++ float16 gate (float16 rewrite of the heavy ops)", "torch_adapter.routing.half_gate", False),
    "emulated": ("the emulated npu device (a PrivateUse1 device)", "torch_adapter.emulated", True),
}


def register(sub: Any) -> None:
    p = sub.add_parser("build", help="compile the adapter's C++ parts now (once per torch version, cached)",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--only", action="append", choices=sorted(PARTS), metavar="PART",
                   help=f"build only this part (repeatable; one of {', '.join(PARTS)})")
    p.add_argument("--verbose", action="store_true", help="show the compiler's whole output")
    p.add_argument("--into", metavar="DIR", help="also copy each built part into DIR (the install: the "
                   "package's _built folder, which sessions look in first)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..core.cpp_build import build_into
    from ..errors import AdapterError

    failed = 0
    for part in args.only or list(PARTS):
        what, module_name, takes_verbose = PARTS[part]
        module = importlib.import_module(module_name)
        was = bool(module.is_built())
        t0 = time.perf_counter()
        try:
            if args.into:
                build_into(module.PART, Path(args.into), verbose=bool(args.verbose))
            else:
                module.build(**({"verbose": bool(args.verbose)} if takes_verbose else {}))
        except Exception as exc:  # AdapterError from the parts' build(), the compiler's own from build_into
            failed += 1
            text = str(exc) if isinstance(exc, AdapterError) else f"{type(exc).__name__}: {exc}"
            first = next((ln for ln in text.splitlines() if ln.strip()), text)
            print(f"{part}: FAILED — {first}", file=sys.stderr)
            continue
        state = "already built" if was else "built"
        print(f"{part}: {state} ({time.perf_counter() - t0:.1f} s) — {what}", flush=True)
    return 1 if failed else 0
