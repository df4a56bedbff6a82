"""Device tensors sent to other processes (``torch.multiprocessing``), as torch_npu's IPC sends them.

torch's own reductions share a CUDA tensor through CUDA IPC and a CPU tensor through a shared-memory
file descriptor; any other device's tensor reaches the CPU path and fails (``_share_fd_: only
available on CPU``). torch_npu registers reductions of its own for ``npu`` tensors
(``torch_npu.multiprocessing.reductions``: the device's IPC handles), so a Hogwild program
(``model.share_memory()``, then ``mp.Process(target=train, args=(model,))``: pytorch/examples'
``mnist_hogwild --cuda``) runs on the NPU. The emulated device does the same with its memory, which
is host memory: the first time a device storage is sent, the C++ device moves it into POSIX shared
memory (``share_fd``; it stays a device storage, accounted to its device), and the receiving process
maps that memory into a device storage of its own (``from_shared_fd``), so both update the same
bytes. A storage is moved once; a process that receives it twice gets one storage (the
``shared_cache`` torch keeps for its own reductions).

:func:`register` wraps the reducer torch registered for each tensor class with ``ForkingPickler``:
device tensors take this path, every other tensor torch's own.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["register", "rebuild_device_tensor"]

_LOCK = threading.Lock()
_REGISTERED: set[str] = set()
_EXT: list[Any] = []  # the started device's C++ extension (set by register; the package imports this module)


def _ext() -> Any:
    if not _EXT:
        raise RuntimeError("torch_adapter: a tensor of the emulated device was sent to a process where the emulated "
                           "device is not started; start it there first (run the child under "
                           "`torch-adapter run --target npu --emulate`, or install(target='npu', emulate=True))")
    return _EXT[0]


def rebuild_device_tensor(cls: type, df: Any, nbytes: int, device: int, dtype: Any, offset: int, size: Any,
                          stride: Any, requires_grad: bool) -> Any:
    """The receiving side: the same shared memory as a device tensor of this process."""
    import os

    import torch
    from torch.multiprocessing.reductions import StorageWeakRef, fd_id, shared_cache, storage_from_cache

    fd = df.detach()
    try:
        key = ("emulated", fd_id(fd))
        storage = storage_from_cache(torch.UntypedStorage, key)
        if storage is None:
            storage = _ext().from_shared_fd(fd, int(nbytes), int(device)).untyped_storage()
            shared_cache[key] = StorageWeakRef(storage)
    finally:
        os.close(fd)
    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _reducer(name: str, torch_reduce: Any) -> Any:
    def reduce_tensor(tensor: Any) -> Any:
        if tensor.device.type != name or tensor.layout is not __import__("torch").strided:
            return torch_reduce(tensor)
        if tensor.requires_grad and not tensor.is_leaf:
            return torch_reduce(tensor)  # torch's own refusal ("Cowardly refusing to serialize non-leaf tensor …")
        import multiprocessing.reduction

        import torch.utils.hooks

        torch.utils.hooks.warn_if_has_hooks(tensor)
        fd, nbytes = _ext().share_fd(tensor)
        return (rebuild_device_tensor, (type(tensor), multiprocessing.reduction.DupFd(fd), nbytes, tensor.get_device(),
                                        tensor.dtype, tensor.storage_offset(), tuple(tensor.size()),
                                        tuple(tensor.stride()), tensor.requires_grad))

    reduce_tensor.__qualname__ = f"reduce_tensor[{name}]"
    reduce_tensor.torch_reduce = torch_reduce  # type: ignore[attr-defined]
    return reduce_tensor


def register(name: str, ext: Any) -> None:
    """Device tensors of the emulated ``name`` travel through shared memory (once per process); ``ext`` is the
    device's C++ extension, which moves a storage into shared memory and maps it back."""
    with _LOCK:
        _EXT[:] = [ext]
        if name in _REGISTERED:
            return
        import torch.multiprocessing  # noqa: F401 - registers torch's reducers first
        from multiprocessing.reduction import ForkingPickler
        from torch.multiprocessing import reductions

        for cls, fn in list(ForkingPickler._extra_reducers.items()):
            if fn is reductions.reduce_tensor:
                ForkingPickler.register(cls, _reducer(name, fn))
        _REGISTERED.add(name)
