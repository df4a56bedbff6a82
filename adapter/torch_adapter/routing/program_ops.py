"""The program's own custom ops: the ops outside torch that the engine routes as it routes aten ops.

A CUDA project's custom op (``torch.library.custom_op("demo::bias_gelu", device_types="cpu")``, a
``Library.define``, a C++ extension's ``TORCH_LIBRARY``) that the target lacks runs its CPU fallback
like an aten op the target lacks: its calls copy their tensors to the CPU and back, the policy
decides (``fallback="error"`` refuses them), and the first call's site is the user's line
(``at cell [5], line 3``). torch's own namespaces (``prims``, ``quantized``, ``c10d``, ``fsdp``,
``inductor``, ...) are not the program's: they are routed only when a policy or registration names
them (their kernels' semantics — asynchronous collectives, packed weights — are no copy-and-run).

An op's origin is where it was defined (:func:`program_op`); the session learns of ops the program
defines, or gives kernels, later through the ``Library.impl`` that redirect/custom_ops.py patches,
which calls ``Engine.registered``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..core.torch_private import all_op_names

__all__ = ["program_op", "program_ops", "ROUTE_NEUTRAL_KEYS"]

TORCH_NAMESPACES = ("aten", "prim", "prims")  # torch's, whatever the definer (prims are defined in Python)
# registrations at these keys never change an op's route (autograd formulas, fake kernels, wrappers)
ROUTE_NEUTRAL_KEYS = ("Autograd", "Meta", "ADInplaceOrView", "Functionalize", "Python", "BackendSelect", "Fake")

_PROGRAM: dict[str, bool] = {}  # op name -> the program's (where an op was defined does not change)
_TORCH_ROOTS: list[tuple[str, str | None]] = []  # (torch's package folder, the source tree of its C++ ops)
_DEFINED_AT = re.compile(r"^debug: registered at (.*?)(?::\d+)?$", re.M)
_CPP = re.compile(r"\.(cpp|cc|cxx|cu|cuh|h|hpp|mm)$")


def _defined_at(name: str) -> str | None:
    """The file (or ``<string>``, ``<ipython-input-...>``) that defined ``name``'s schema, as the
    dispatcher recorded it (``torch._C._dispatch_dump``); None when it recorded none."""
    import torch

    try:
        match = _DEFINED_AT.search(torch._C._dispatch_dump(name))
    except RuntimeError:
        return None
    return match.group(1) if match else None


def _torch_roots() -> tuple[str, str | None]:
    """torch's package folder, and the source tree its C++ ops were compiled from (the folder the
    definitions of two of its ops share: ``/__w/pytorch/pytorch`` for the wheels), None when unknown."""
    if not _TORCH_ROOTS:
        import torch

        package = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        where = [_defined_at(n) for n in ("aten::add.Tensor", "profiler::_record_function_enter_new")]
        tree = None
        if all(w and _CPP.search(w) for w in where):
            common = os.path.commonpath(where)  # type: ignore[arg-type]
            tree = common + os.sep if common not in ("", os.sep) else None
        _TORCH_ROOTS.append((package, tree))
    return _TORCH_ROOTS[0]


def _opdef(qualname: str) -> Any:
    """custom_op's record of the op (``torch._library.custom_ops.OPDEFS``), or None."""
    from torch._library import custom_ops

    return getattr(custom_ops, "OPDEFS", {}).get(qualname)


def program_op(name: str) -> bool:
    """Is the op ``name`` the program's own — a custom op defined by the program or a library it uses —
    rather than one of torch's? Told by where it was defined: a ``custom_op`` by its function's module
    (the dispatcher names torch's custom_ops.py for every one); any other op by the dispatcher's record
    of its definition: a Python file outside torch's package, code without a file (``<string>``, a
    notebook cell), or a C++ file outside torch's source tree. Remembered per name."""
    known = _PROGRAM.get(name)
    if known is not None:
        return known
    if name.partition("::")[0] in TORCH_NAMESPACES:
        return False
    opdef = _opdef(name.partition(".")[0])
    if opdef is not None:
        module = str(getattr(getattr(opdef, "_init_fn", None), "__module__", None) or "")
        mine = module != "torch" and not module.startswith("torch.")
    else:
        where = _defined_at(name)
        package, tree = _torch_roots()
        if where is None:
            mine = False
        elif where.startswith("<"):
            mine = True
        elif _CPP.search(where):
            mine = tree is not None and not where.startswith(tree)
        else:
            mine = not os.path.abspath(where).startswith(package)
    _PROGRAM[name] = mine
    return mine


def program_ops(served: Any = ()) -> set[str]:
    """The program's custom ops the dispatcher knows now, less ``served`` (the ops the session gives a
    kernel of its own at the target's key: redirect/custom_ops.py's CUDA-kernel ones)."""
    return {n for n in all_op_names()
            if n.partition("::")[0] not in TORCH_NAMESPACES and n not in served and program_op(n)}
