"""``torch.device(0)``: an int ordinal means CUDA device 0, as it does on a CUDA machine.

On a torch without an accelerator the C constructor refuses an int ("Cannot access
accelerator device when none is available") before any use site could map it, and
libraries call it themselves: transformers' ``from_pretrained(device_map="auto")`` runs
``torch.device(0)`` on every int of the device map, accelerate does the same in
``set_module_tensor_to_device``. ``torch.device`` is a C type (it can be neither subclassed
nor patched), so the *name* ``torch.device`` gets a stand-in class while installed:

- calling it with one int gives ``torch.device("cuda", i)`` — the real C object, mapped to
  the target where it is used, like ``torch.device("cuda:0")`` — to the program and its libraries;
  torch's own code (decided per caller, as ``torch.accelerator``'s answers are) gets torch's
  answer, the machine's accelerator (``npu:0`` on an npu), and ``cuda:i`` only where this torch
  has none; every other call is forwarded unchanged, so ``torch.device("meta")`` and
  ``with torch.device(...)`` are torch's;
- ``isinstance(d, torch.device)`` and ``issubclass`` answer for the C type; attributes of the
  class (``torch.device.type``) are the C type's;
- pickling a device writes ``torch.device`` exactly as torch does (a ``copyreg`` entry,
  removed at uninstall), so files and child processes never depend on the adapter.

The stand-in compares and hashes equal to the C type (``torch.fx`` code generation and
type-keyed tables rely on ``obj == torch.device``).

The same equality makes it torch.device to dynamo: its constant-fold class set finds the
stand-in, so ``torch.device(...)`` in compiled code folds to a constant (no graph break).

Limit (docs/redirect.md says why the stand-in stays: libraries call ``torch.device(int)``
themselves, and only an irreversible PrivateUse1 backend would make the C constructor accept
it): ``type(d) is torch.device`` is False while installed.
"""

from __future__ import annotations

import copyreg
from typing import Any

import torch

from ..core.patching import STAND_IN

__all__ = ["apply", "torch_asks"]


def torch_asks() -> bool:
    """Whether ``torch.device(i)`` was called by torch's own code (not while dynamo traces or folds the
    program's call): the nearest frame past pass-through ones decides, as for ``torch.accelerator``."""
    import sys

    from .accelerator import PASS_THROUGH, TEST_HELPERS

    if torch.compiler.is_dynamo_compiling():
        return False
    frame = sys._getframe(2)  # torch_asks <- the stand-in <- its caller
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if name not in PASS_THROUGH:
            return ((name == "torch" or name.startswith("torch.")) and not name.startswith(TEST_HELPERS)
                    and not name.startswith("torch._dynamo"))  # dynamo folding the program's call: the program's
        frame = frame.f_back
    return False


def apply(session: Any, mapper: Any) -> None:
    p = session.patcher
    CDevice = type(torch.device("cpu"))  # noqa: N806 - the C type, whatever the name holds now

    class _DeviceMeta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, CDevice)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, CDevice)

        def __getattr__(cls, name: str) -> Any:
            return getattr(CDevice, name)

        # The stand-in *is* torch.device to code that compares types: torch.fx's code generator
        # binds the global ``device`` only when the C type equals ``torch.device`` (else a
        # graph printing ``device(type='cpu')`` fails with NameError), and type-keyed tables
        # (pytree, dispatch dicts) find the C type's entry through it.
        def __eq__(cls, other: object) -> bool:
            return other is cls or other is CDevice

        def __ne__(cls, other: object) -> bool:
            return not (other is cls or other is CDevice)

        def __hash__(cls) -> int:
            return hash(CDevice)

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            if len(args) == 1 and not kwargs and type(args[0]) is int:
                if torch_asks():
                    try:  # torch's own code: torch's answer, the machine's accelerator (npu:0 on an npu)
                        return CDevice(*args)
                    except RuntimeError:  # a torch without an accelerator: the ordinal is the program's cuda
                        pass
                dev = CDevice("cuda", args[0])
                mapper.log.record("device", f"torch.device({args[0]})", f"{mapper.device(args[0])} (where it is used)",
                                  depth=3)
                return dev
            return CDevice(*args, **kwargs)

    device = _DeviceMeta("device", (), {"__module__": "torch", "__qualname__": "device", "__doc__": CDevice.__doc__,
                                        STAND_IN: CDevice})

    def reduce(dev: Any) -> tuple[Any, tuple[Any, ...]]:
        # what torch's own __reduce__ gives, with the class looked up by name as pickle does
        return device, (dev.type,) if dev.index is None else (dev.type, dev.index)

    p.set(torch, "device", device)
    p.set_item(copyreg.dispatch_table, CDevice, reduce)
