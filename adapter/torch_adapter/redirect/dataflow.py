"""Data movement around the model: DataLoader pinning and ``nn.DataParallel``.

``DataLoader(pin_memory=True, pin_memory_device="cuda")``: no pinning on the CPU target
(pinning needs an accelerator), torch's current accelerator elsewhere. ``nn.DataParallel``
asks ``torch._utils._get_available_device_type()`` through the module
``torch.nn.parallel.data_parallel`` (addressed by its import path: the attribute of that name
on ``torch.nn.parallel`` is the *function* ``data_parallel``); it answers for the target, so
on the CPU ``DataParallel(model).cuda()`` runs the module as it is, forward and backward -- and on
an accelerator target whose torch has no scatter/gather for it (``torch._C._scatter`` is CUDA's,
absent from the CPU builds torch_npu and the emulated npu run on), on the device as it is.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

__all__ = ["apply"]


def apply(p: Any, mapper: Any) -> None:
    import torch.nn.parallel.data_parallel  # noqa: F401 - loads the module patched below
    from torch.utils.data import DataLoader

    orig_init = DataLoader.__init__

    @functools.wraps(orig_init)
    def dl_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("pin_memory_device"):
            mapper.log.record("dataloader", f"DataLoader(pin_memory_device={kwargs['pin_memory_device']!r})",
                              "the current accelerator (torch's default)", depth=3)
            kwargs["pin_memory_device"] = ""
        if kwargs.get("pin_memory") and mapper.on_cpu:
            mapper.log.record("dataloader", "DataLoader(pin_memory=True)", "pin_memory=False (CPU target)", depth=3)
            kwargs["pin_memory"] = False
        orig_init(self, *args, **kwargs)

    p.set(DataLoader, "__init__", dl_init)

    # nn.DataParallel asks torch._utils which device type is available; answer for the target
    # (None on the CPU, where DataParallel runs the module as it is).
    # The module by its import path: ``torch.nn.parallel.data_parallel`` is the *function* of
    # that name (re-exported by torch/nn/parallel/__init__.py), which shadows the module.
    # Elsewhere the target's type -- where torch has the C++ scatter/gather DataParallel splits batches
    # with (torch._C._scatter, in CUDA builds only). A build without it (torch_npu's, the emulated npu's:
    # DataParallel(model).cuda() in pytorch/examples' imagenet raised "torch._C has no attribute
    # '_scatter'") runs the module on the device as it is, as DataParallel over one device does.
    import torch

    device_type = None if mapper.on_cpu or not hasattr(torch._C, "_scatter") else mapper.type
    dp_module = sys.modules["torch.nn.parallel.data_parallel"]
    orig_available = dp_module._get_available_device_type

    @functools.wraps(orig_available)
    def _get_available_device_type() -> str | None:
        return device_type

    p.set(dp_module, "_get_available_device_type", _get_available_device_type)
    if device_type is None:
        _patch_functional_data_parallel(p, mapper, dp_module)


def _patch_functional_data_parallel(p: Any, mapper: Any, dp_module: Any) -> None:
    """``nn.parallel.data_parallel(module, inputs, device_ids)`` needs an accelerator type; on
    the CPU target it runs the module on its inputs, as ``nn.DataParallel`` does there."""
    import torch.nn.parallel as parallel

    orig = dp_module.data_parallel

    @functools.wraps(orig)
    def data_parallel(module: Any, inputs: Any, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                      module_kwargs: Any = None) -> Any:
        where = "CPU target" if mapper.on_cpu else f"no scatter/gather for {mapper.type} in this torch"
        mapper.log.record("device", "data_parallel(...)", f"module(*inputs) ({where})", depth=3)
        if not isinstance(inputs, tuple):
            inputs = (inputs,) if inputs is not None else ()
        return module(*inputs, **(module_kwargs or {}))

    p.set(dp_module, "data_parallel", data_parallel)
    if getattr(parallel, "data_parallel", None) is orig:
        p.set(parallel, "data_parallel", data_parallel)
