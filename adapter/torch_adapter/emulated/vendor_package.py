"""``torch_npu`` for the emulated npu: the package libraries import to find an NPU.

Libraries do not ask torch whether an NPU is there, they ask for torch_npu: accelerate's
``is_npu_available()`` is ``find_spec("torch_npu")`` + ``import torch_npu`` + ``torch.npu.is_available()``,
and accelerate imports torch_npu again in ``state``, ``accelerator`` and ``utils.modeling`` once it said
yes; transformers' ``is_torch_npu_available()`` is ``find_spec`` + ``import``. Without the package, a
program on the emulated npu that goes through accelerate (``Accelerator().device``, its autocast) was put
on the CPU where a real NPU machine has it on the npu — the acceptance run on the emulated npu found it
(diffusers' fp16 training: ``Accelerator().device`` cpu, no autocast, 'mat1 and mat2 must have the same
dtype').

So the emulated device brings a ``torch_npu`` module (:func:`register`, at start): importable and found
by ``importlib.util.find_spec`` (it is in ``sys.modules`` with a spec), its ``npu`` the device module
(``torch.npu``), ``__version__`` torch's with ``+emulated``. It has no distribution metadata, so a
library that also reads the installed version from metadata (diffusers' ``is_torch_npu_available``)
still says no, and keeps its portable path. torch_npu's own kernels (``torch_npu.npu_fusion_attention``,
``npu_rms_norm``, …) are not emulated: asking for one raises AttributeError naming this.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

__all__ = ["PACKAGE", "register", "is_stand_in"]

PACKAGE = {"npu": "torch_npu"}  # emulated target -> the vendor package libraries import to find it
_MARK = "__torch_adapter_emulated__"


def is_stand_in(module: Any) -> bool:
    """Is ``module`` the emulated device's stand-in (not the vendor's package)?"""
    return bool(getattr(module, _MARK, False))


def register(name: str, device_module: Any) -> Any:
    """Put the stand-in for ``name``'s vendor package in ``sys.modules`` (idempotent); returns it (None when
    the target has no package to stand for)."""
    package = PACKAGE.get(name)
    if package is None:
        return None
    existing = sys.modules.get(package)
    if existing is not None:
        return existing
    import torch

    mod = types.ModuleType(package, f"{package} as torch_adapter's emulated {name} provides it: the device "
                                    f"module (torch.{name}) without the vendor's kernels")
    mod.__spec__ = importlib.machinery.ModuleSpec(package, None, origin=f"torch_adapter emulated {name}")
    mod.__version__ = torch.__version__.split("+")[0] + "+emulated"
    setattr(mod, name, device_module)
    setattr(mod, _MARK, True)

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AttributeError(f"module {package!r} has no attribute {attr!r}: the emulated {name} (torch_adapter) "
                             f"provides {package}'s device module ({package}.{name}), not its own kernels")

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    sys.modules[package] = mod
    return mod
