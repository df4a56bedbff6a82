"""``python -m torch_adapter.emulated build [--verbose]``: build the emulated device's C++ extension
now (once per torch version; cached), so no program or notebook cell waits for the compiler."""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import TargetError
from . import build, is_built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_adapter.emulated", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("build", "status"))
    p.add_argument("--verbose", action="store_true", help="show the compiler's whole output")
    args = p.parse_args(argv)
    if args.action == "status":
        print("built" if is_built() else "not built")
        return 0 if is_built() else 1
    t0 = time.perf_counter()
    was = is_built()
    try:
        build(verbose=args.verbose)
    except TargetError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"emulated device: {'already built' if was else 'built'} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
