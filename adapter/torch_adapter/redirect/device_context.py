"""torch's device-context machinery under the adapter, and after it.

``with torch.device(d):``, ``torch.set_default_device(d)``, accelerate's
``init_empty_weights`` and transformers' ``from_pretrained`` (which builds every model under
``torch.device("meta")``) all push ``torch.utils._device.DeviceContext``, a
TorchFunctionMode that fills in ``device=`` for the functions in
``_device_constructors()``. That set is ``lru_cache``d and built at its first use *from the
torch attributes of that moment*. If it were first built while the factory wrappers of
:mod:`.devices` stand in ``torch.empty`` & co., it would hold the wrappers; the mode receives
torch's own functions (the wrappers call them), so it would no longer recognise any
factory — meta init, default devices and ``with torch.device`` would silently stop working,
and keep not working after ``uninstall()``.

So, before any factory is wrapped, :func:`apply` clears the cache and builds it from
torch's own functions; the mode then recognises every factory while installed (a wrapper
hands the mode torch's function, with the device already mapped). ``uninstall()`` clears it
again once the attributes are back, so it is rebuilt from them at its next use, whatever
happened in between; so are ``torch.overrides``' tables of overridable functions when they
were first built while installed. ``DeviceContext(device)`` maps CUDA devices (and int ordinals) to the
target, so ``with torch.device("cuda"):`` and ``set_default_device("cuda")`` land there.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..core import torch_private as tp

__all__ = ["apply"]


def apply(session: Any, mapper: Any, spell: Any) -> None:
    """Patch DeviceContext and the default-device setters; must run before factories are wrapped."""
    p = session.patcher
    # torch's other caches built from its attributes (torch.overrides' tables): one first
    # built while installed would keep the wrappers, so it is forgotten at uninstall.
    cold = [c for c in tp.attribute_caches() if c.cache_info().currsize == 0]
    tp.reset_device_constructors()
    tp.device_constructors()  # built now, from torch's own factories

    def forget() -> None:
        for cache in cold:
            cache.cache_clear()
        tp.reset_device_constructors()

    p.after_restore(forget)

    ctx_cls = tp.device_context_class()
    orig_ctx_init = ctx_cls.__init__

    @functools.wraps(orig_ctx_init)
    def __init__(self: Any, device: Any) -> None:  # noqa: N807 - the method it stands for
        orig_ctx_init(self, mapper.map(device, f"with torch.device({spell(device)})", ints=True))

    p.set(ctx_cls, "__init__", __init__)

    orig_set_default = torch.set_default_device
    # The default device set_default_tensor_type(torch.cuda.XTensor) gave a device target (below); a
    # later CPU tensor type takes it back, as CUDA's legacy default tensor type is taken back.
    from_tensor_type: list[Any] = []

    @functools.wraps(orig_set_default)
    def set_default_device(device: Any) -> None:
        from_tensor_type.clear()  # the program's own default device from now on
        return orig_set_default(mapper.map(device, f"torch.set_default_device({spell(device)})", ints=True))

    p.set(torch, "set_default_device", set_default_device)

    orig_set_default_tensor_type = torch.set_default_tensor_type

    @functools.wraps(orig_set_default_tensor_type)
    def set_default_tensor_type(t: Any, /) -> None:
        name = getattr(t, "__torch_adapter_legacy__", t)
        if isinstance(name, str) and name.startswith("torch.cuda."):
            cpu_name = "torch." + name[len("torch.cuda."):]
            mapper.log.record("device", f"set_default_tensor_type({name!r})", cpu_name, depth=3)
            orig_set_default_tensor_type(cpu_name)
            if not mapper.on_cpu:
                torch.set_default_device(mapper.device(None))
                from_tensor_type.append(getattr(torch.cuda, name[len("torch.cuda."):]))  # its legacy class
            return None
        orig_set_default_tensor_type(t)
        if from_tensor_type:  # a CPU tensor type after a CUDA one: tensors are made on the CPU again
            from_tensor_type.clear()
            orig_set_default(None)
        return None

    p.set(torch, "set_default_tensor_type", set_default_tensor_type)
    if not mapper.on_cpu:
        _patch_legacy_tensor_new(p, from_tensor_type)


def _patch_legacy_tensor_new(p: Any, from_tensor_type: list[Any]) -> None:
    """``torch.Tensor(...)``, the legacy constructor of the default tensor type: after
    ``set_default_tensor_type(torch.cuda.FloatTensor)`` CUDA makes it a CUDA tensor, takes ``device="cuda"``
    and refuses ``device="cpu"`` ("legacy constructor expects device type: cuda …"). On a device target the
    default type is the CPU's with the target as default device, which torch's legacy constructor does not
    consult (``torch.Tensor(2)`` was a CPU tensor, ``torch.Tensor(2, device="cuda")`` raised): while a CUDA
    type is the default, ``torch.Tensor(...)`` is that type's constructor (``torch.cuda.FloatTensor``'s
    stand-in; a subclass's object of that class). Every other time torch's own."""
    import torch

    base_new = torch._C.TensorBase.__new__
    had_own = "__new__" in torch.Tensor.__dict__

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - the method it stands for
        if from_tensor_type:
            made = from_tensor_type[-1](*args, **kwargs)
            return made if cls is torch.Tensor else made.as_subclass(cls)
        return base_new(cls, *args, **kwargs)

    if had_own:  # a torch that defines its own: leave it (the legacy default type is deprecated since 2.1)
        return
    p.set(torch.Tensor, "__new__", staticmethod(__new__))
