"""Device redirection: every way CUDA-written code names a CUDA device → the target's.

The mapping (:class:`DeviceMapper`) is one small pure function; the patches below apply
it at the entry points where a device is *used*: factories and ``*_like`` functions,
``Tensor.to/.cuda/.new_*/.pin_memory/.type``, ``Module.to`` (an int ordinal is parsed by
torch before any tensor moves), ``torch.load(map_location=...)``,
``torch.Generator(device=...)``, storages and safetensors. ``Module.cuda/.to_empty`` follow
from the Tensor and factory patches; :mod:`.device_context` (``with torch.device``,
``set_default_device``), :mod:`.device_ordinal` (``torch.device(0)``) and :mod:`.dataflow`
(DataLoader, DataParallel) are applied from here. No per-op hook: a redirect costs one
Python call where a device is named.

Semantics of ``tensor.is_cuda`` / ``tensor.device.type``: truthful. A redirected tensor
*is* on the target (``cpu``, ``npu``, ...), and says so; ``torch.cuda.is_available()``
answers for the target. See docs/redirect.md for why (libraries choose NCCL, kernels and
dtypes from a tensor's device: lying there breaks them).
"""

from __future__ import annotations

import copyreg
import functools
from typing import Any, Callable

import torch
from torch.overrides import handle_torch_function, has_torch_function

from ..core import torch_private as tp
from ..core import torch_private as _tp
from ..core import caller_warnings
from ..core.caller_warnings import as_caller
from ..core.patching import mark_stand_in
from . import dtype_policy

__all__ = ["DeviceMapper", "apply"]

mode_enabled = tp.torch_function_mode_check()

_DEVICE = type(torch.device("cpu"))  # the C type (while installed the name torch.device is a stand-in)

# Every torch.* function whose schema takes ``Device? device`` (derived from torch's schemas, so
# private constructors such as ``_empty_affine_quantized`` are included), plus the Python-level
# factories that have no aten schema of their own.
PYTHON_FACTORIES = ("asarray",)
FACTORIES = tuple(sorted(set(_tp.device_factory_names()) | set(PYTHON_FACTORIES)))
SUBMODULE_FACTORIES = (("fft", "fftfreq"), ("fft", "rfftfreq"), ("nested", "nested_tensor"),
                       ("nested", "as_nested_tensor"))
TENSOR_NEW = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided")


class DeviceMapper:
    """Maps CUDA device spellings to the target's device. Everything else passes through."""

    def __init__(self, target: Any, log: Any) -> None:
        self.target = target
        self.type = target.device_type
        self.on_cpu = self.type == "cpu"
        self.log = log
        self.logical_index = 0  # torch.cuda.set_device() on targets with one device
        # set by the routing layer on a simulated target: a move to it that ran no op is checked
        # there (the dtypes the real backend refuses); redirect imports nothing of routing
        self.moved_hook: Any = None
        self._devices: dict[int | None, torch.device] = {}
        self.names: dict[torch.device, str] = {}  # str() of each device made below, for the log rows
        self.device(None)  # now, outside any mode of the program
        # what a float16 request gives (None: float16): set by redirect/dtype_policy.apply
        self.half_as: torch.dtype | None = None
        self.half_why = ""

    def device(self, index: int | None) -> torch.device:
        # made once per index: torch.device(...) is itself a torch function, so building one per
        # call would show every TorchFunctionMode of the program a call it never made
        key = None if self.on_cpu else index
        dev = self._devices.get(key)
        if dev is None:
            dev = self._devices[key] = (_DEVICE("cpu") if self.on_cpu else _DEVICE(self.type) if index is None
                                        else _DEVICE(self.type, index))
            self.names[dev] = str(dev)
        return dev

    def is_cuda(self, dev: Any) -> bool:
        if type(dev) is str:
            return dev.startswith("cuda")
        if isinstance(dev, _DEVICE):
            return dev.type == "cuda"
        return False

    def map(self, dev: Any, asked: str | None = None, *, ints: bool = False) -> Any:
        """``dev`` with any CUDA device replaced; ``ints`` treats int as a CUDA index.

        ``asked`` labels the request in the redirect log (default ``device='cuda:0'``).
        """
        if dev is None:
            return None
        if type(dev) is str:
            if not dev.startswith("cuda"):
                return dev
            index = _index_of(dev)
        elif isinstance(dev, _DEVICE):
            if dev.type != "cuda":
                return dev
            index = dev.index
        elif ints and type(dev) is int:
            index = dev
        else:
            return dev
        new = self.device(index)
        if self.log.enabled:
            self.log.record("device", asked or f"device={_spell(dev)}", self.names[new], depth=4)
        return new


    def dtype(self, dt: Any, asked: str) -> Any:
        """``dt`` under the dtype policy (redirect/dtype_policy.py): float16 → ``half_as`` where set."""
        if dt is not _HALF or self.half_as is None:
            return dt
        if self.log.enabled:
            self.log.record("dtype", asked, f"{str(self.half_as)[6:]} [{self.half_why}]", depth=4)
        return self.half_as


_HALF = torch.float16


def _spell(dev: Any) -> str:
    """'cuda:0' for torch.device('cuda', 0): how users write it (remembered: it is asked per redirected call)."""
    kind = type(dev)
    if kind is not str and kind is not int and kind is not _DEVICE:  # (bool, a subclass: not remembered)
        return repr(str(dev)) if isinstance(dev, _DEVICE) else repr(dev)
    text = _SPELLED.get((kind, dev))
    if text is None:
        text = repr(str(dev)) if kind is _DEVICE else repr(dev)
        if len(_SPELLED) < 1024:
            _SPELLED[(kind, dev)] = text
    return text


_SPELLED: dict[Any, str] = {}


def _index_of(spec: str) -> int | None:
    if spec == "cuda":
        return None
    kind, _, index = spec.partition(":")
    if kind == "cuda" and index.isdigit():  # parsed here: torch.device() would be seen by modes
        return int(index)
    try:
        return _DEVICE(spec).index
    except RuntimeError:
        return None


def _wrap_device_kwarg(orig: Callable, mapper: DeviceMapper, label: str, *, protocol: bool = False) -> Callable:
    """``orig`` with ``device=`` mapped. ``protocol``: a torch.* function, whose torch-function
    dispatch the wrapper runs itself (below)."""

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dev = kwargs.get("device")
        redirected = dev is not None and mapper.is_cuda(dev) or type(dev) is int
        if redirected:
            kwargs["device"] = mapper.map(dev, f"{label}(device={_spell(dev)})", ints=True)
            if kwargs.get("dtype") is _HALF and mapper.half_as is not None:  # float16 *on the device*: the
                kwargs["dtype"] = mapper.dtype(_HALF, f"{label}(dtype=torch.float16)")  # dtype policy's dtype
        if protocol:
            # __torch_function__ is handed the function the program called, as torch does for
            # its own Python functions: ``func is torch.zeros_like`` holds in a subclass or a
            # TorchFunctionMode while installed (torch's C code would hand them the builtin
            # behind the wrapper). Torch's tables know the wrapper beside it (.torch_tables).
            relevant = args[:1] if like else ()
            if mode_enabled() or (relevant and has_torch_function(relevant)):
                return handle_torch_function(wrapper, relevant, *args, **kwargs)
        if redirected:  # torch's warnings name the caller's line, not this one
            return _as_caller(orig, args, kwargs)
        return orig(*args, **kwargs)

    like = orig.__name__.endswith("_like")  # torch dispatches *_like on its input's type (a subclass)
    return mark_stand_in(caller_warnings.pass_through(wrapper), orig)


def _as_caller(orig: Callable, args: tuple, kwargs: dict) -> Any:
    """``orig(*args, **kwargs)`` for a redirected call, with the warnings it raises attributed to
    the line that called the wrapper (C++ warnings name the innermost Python frame: the
    wrapper's) — per thread, no process-wide state swapped (core/caller_warnings.py). Only
    redirected calls pay for this. Not while dynamo traces (compiled code warns at trace time)."""
    if _dynamo_compiling():
        return orig(*args, **kwargs)
    return as_caller(orig, args, kwargs, depth=3)  # as_caller <- _as_caller <- wrapper <- the caller


_dynamo_compiling = torch.compiler.is_dynamo_compiling


def _checked(mapper: DeviceMapper, moved: Any, source: Any = None) -> Any:
    """On a simulated target, a move to it checks the dtypes the real backend refuses, through
    the hook the routing layer set (routing/dtype_check.py: a host-to-host move runs no op that
    could; a tensor move that made a new tensor ran the allocation check already)."""
    hook = mapper.moved_hook
    if hook is None or (source is not None and moved is not source):
        return moved
    return hook(moved)


_DTYPE = torch.dtype
_HALF_TYPES = ("torch.HalfTensor", "torch.cuda.HalfTensor")


def _looks_like_device(arg: Any) -> bool:
    return type(arg) is str or isinstance(arg, _DEVICE) or (type(arg) is int)


def apply(session: Any) -> DeviceMapper:
    """Install the device patches on ``session.patcher``; return the mapper."""
    p = session.patcher
    mapper = DeviceMapper(session.target, session.redirect_log)
    session.device_mapper = mapper
    if mapper.type == "cuda":
        return mapper  # real CUDA: nothing to redirect
    from . import dataflow, device_context, device_ordinal

    device_context.apply(session, mapper, _spell)  # before any factory is wrapped
    device_ordinal.apply(session, mapper)

    orig_to = torch.Tensor.to  # torch's own, before the patch below
    _patch_factories(p, mapper)
    _patch_tensor_to(p, mapper, orig_to)
    _patch_tensor_methods(p, mapper, orig_to)
    dtype_policy.patch(p, mapper, orig_to)
    _patch_generator(p, mapper)
    _patch_load(p, mapper)
    _patch_storages(p, mapper)
    dataflow.apply(p, mapper)
    _patch_safetensors(p, mapper)
    caller_warnings.install(p)  # after the stand-ins: warnings at the caller's line (redirected or passed through)
    return mapper




def _patch_factories(p: Any, mapper: DeviceMapper) -> None:
    """Every factory taking ``device=`` (torch.*, torch.<submodule>.*, Tensor.new_*)."""
    T = torch.Tensor
    for name in FACTORIES:
        fn = getattr(torch, name, None)
        if fn is not None:
            p.set(torch, name, _wrap_device_kwarg(fn, mapper, f"torch.{name}", protocol=True))
    for mod_name, name in SUBMODULE_FACTORIES:
        mod = getattr(torch, mod_name, None)
        fn = getattr(mod, name, None) if mod is not None else None
        if fn is not None:
            p.set(mod, name, _wrap_device_kwarg(fn, mapper, f"torch.{mod_name}.{name}", protocol=True))
    for name in TENSOR_NEW:
        p.set(T, name, _wrap_device_kwarg(getattr(T, name), mapper, f"Tensor.{name}"))


def _patch_tensor_to(p: Any, mapper: DeviceMapper, orig_to: Any) -> None:
    """``Tensor.to`` with a CUDA device (or an int ordinal), and ``Module.to``."""
    T = torch.Tensor

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not kwargs and (not args or type(args[0]) is _DTYPE):  # x.to(dtype), the common call: no device
            if args and args[0] is _HALF and mapper.half_as is not None:
                return orig_to(self, mapper.dtype(_HALF, "Tensor.to(torch.float16)"), *args[1:])
            return orig_to(self, *args)
        redirected = False
        if args and _looks_like_device(args[0]) and mapper.is_cuda(args[0]) or (args and type(args[0]) is int):
            args = (mapper.map(args[0], f"Tensor.to({_spell(args[0])})", ints=True), *args[1:])
            redirected = True
        dev = kwargs.get("device")
        if dev is not None and (mapper.is_cuda(dev) or type(dev) is int):
            kwargs["device"] = mapper.map(dev, f"Tensor.to(device={_spell(dev)})", ints=True)
        if mapper.half_as is not None:
            moved = redirected or dev is not None and kwargs["device"] is not dev
            new_args, new_kwargs = dtype_policy.to_args(mapper, self, args, kwargs, moved)
            redirected = redirected or new_args is not args or new_kwargs is not kwargs
            args, kwargs = new_args, new_kwargs
        if redirected or dev is not None and kwargs["device"] is not dev:
            return _checked(mapper, _as_caller(orig_to, (self, *args), kwargs), self)
        return orig_to(self, *args, **kwargs)

    p.set(T, "to", functools.wraps(orig_to)(caller_warnings.pass_through(to)))
    _patch_module_to(p, mapper)


def _patch_tensor_methods(p: Any, mapper: DeviceMapper, orig_to: Any) -> None:
    """``Tensor.cuda``, pinning, legacy ``Tensor.type("torch.cuda.…")`` and ``record_stream``."""
    T = torch.Tensor
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        if has_torch_function((self,)):  # a subclass or mode sees Tensor.cuda, as on CUDA (not the to() below)
            return handle_torch_function(cuda, (self,), self, device, non_blocking=non_blocking,
                                         memory_format=memory_format)
        index = device if type(device) is int else (_index_of(device) if isinstance(device, str)
                                                       else getattr(device, "index", None))
        new = mapper.device(index)
        mapper.log.record("device", "Tensor.cuda()" if device is None else f"Tensor.cuda({device!r})",
                          mapper.names[new], depth=3)
        if mapper.half_as is not None and dtype_policy.is_half(self):
            return orig_to(self, new, mapper.dtype(_HALF, "Tensor.cuda() of a float16 tensor"),
                           non_blocking=non_blocking, memory_format=memory_format)
        return _checked(mapper, orig_to(self, new, non_blocking=non_blocking, memory_format=memory_format), self)

    p.set(T, "cuda", caller_warnings.pass_through(cuda))

    orig_pin = T.pin_memory

    def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        if mapper.on_cpu:  # pinning needs an accelerator: on the CPU it is a no-op
            mapper.log.record("device", "Tensor.pin_memory()", "not pinned (CPU target)", depth=3)
            return self
        return orig_pin(self) if device is None else orig_pin(self, mapper.map(device, "pin_memory"))

    p.set(T, "pin_memory", pin_memory)

    orig_is_pinned = T.is_pinned

    def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
        if mapper.on_cpu:
            return False
        return orig_is_pinned(self) if device is None else orig_is_pinned(self, mapper.map(device))

    p.set(T, "is_pinned", is_pinned)

    orig_type = T.type

    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        name = getattr(dtype, "__torch_adapter_legacy__", dtype)
        if mapper.half_as is not None and (name is _HALF or name in _HALF_TYPES):
            return orig_to(self, mapper.device(None) if name == "torch.cuda.HalfTensor" else self.device,
                           mapper.dtype(_HALF, f"Tensor.type({name!r})"), non_blocking=non_blocking)
        if isinstance(name, str) and name.startswith("torch.cuda."):
            cpu_name = "torch." + name[len("torch.cuda."):]
            new = mapper.device(None)
            mapper.log.record("device", f"Tensor.type({name!r})", f"{cpu_name} on {new}", depth=3)
            return orig_to(orig_type(self, cpu_name), new, non_blocking=non_blocking)
        if dtype is None:
            return orig_type(self, **kwargs) if kwargs else orig_type(self)
        return orig_type(self, dtype, non_blocking, **kwargs)

    p.set(T, "type", caller_warnings.pass_through(type_))

    orig_record_stream = T.record_stream

    def record_stream(self: torch.Tensor, s: Any) -> None:  # torch names the parameter ``s``
        if isinstance(s, torch.Stream) or type(s).__module__.startswith("torch"):
            if not getattr(s, "__torch_adapter_stream__", False):
                return orig_record_stream(self, s)
        return None  # the CPU target's streams are synchronous: nothing to record

    p.set(T, "record_stream", record_stream)


def _patch_module_to(p: Any, mapper: DeviceMapper) -> None:
    """``Module.to(0)`` / ``.to(device=0)``: torch parses an int as "accelerator 0" before any
    tensor moves (an error on a machine without one), so the device is mapped here first."""
    orig = torch.nn.Module.to

    @functools.wraps(orig)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        moved = False
        if args and (type(args[0]) is int or mapper.is_cuda(args[0])):
            args = (mapper.map(args[0], f"Module.to({_spell(args[0])})", ints=True), *args[1:])
            moved = True
        dev = kwargs.get("device")
        if dev is not None and (type(dev) is int or mapper.is_cuda(dev)):
            kwargs["device"] = mapper.map(dev, f"Module.to(device={_spell(dev)})", ints=True)
            moved = True
        out = orig(self, *args, **kwargs)
        if moved and mapper.half_as is not None:
            dtype_policy.module_moved(mapper, self)
        return _checked(mapper, out) if moved else out

    p.set(torch.nn.Module, "to", caller_warnings.pass_through(to))


def _patch_safetensors(p: Any, mapper: DeviceMapper) -> None:
    """safetensors.torch.load_file(..., device="cuda") and safe_open(..., device="cuda")."""
    import importlib.util

    if importlib.util.find_spec("safetensors") is None:
        return
    import safetensors
    import safetensors.torch as st

    for owner, name in ((st, "load_file"), (st, "safe_open"), (safetensors, "safe_open")):
        orig = getattr(owner, name, None)
        if orig is None:
            continue

        def make(orig: Callable, label: str) -> Callable:
            @functools.wraps(orig)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                dev = kwargs.get("device")
                if isinstance(dev, (str, int, _DEVICE)) and (mapper.is_cuda(dev) or type(dev) is int):
                    kwargs["device"] = str(mapper.map(dev, f"{label}(device={_spell(dev)})", ints=True))
                    if mapper.half_as is not None and label == "safetensors.load_file":
                        return dtype_policy.loaded(mapper, orig(*args, **kwargs), f"{label}(device='cuda') of float16 tensors")
                return orig(*args, **kwargs)

            return wrapper

        p.set(owner, name, make(orig, f"safetensors.{name}"))


def _patch_generator(p: Any, mapper: DeviceMapper) -> None:
    Original = torch.Generator

    class _GeneratorMeta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, Original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, Original)

    class Generator(metaclass=_GeneratorMeta):
        """torch.Generator whose device="cuda" means the target (torch_adapter)."""

        def __new__(cls, device: Any = "cpu") -> Any:  # type: ignore[misc]
            return Original(mapper.map(device, f"torch.Generator(device={_spell(device)})", ints=True))

    mark_stand_in(Generator, Original)
    Generator.__doc__ = Original.__doc__
    Generator.__module__, Generator.__qualname__ = "torch", "Generator"  # pickled by torch's name

    def reduce(gen: Any) -> Any:
        # torch's own reduction names the class torch.Generator, which pickle looks up and finds
        # the stand-in: the stand-in is written instead, so a pickle made in the session loads as
        # torch's Generator after uninstall() or in a plain interpreter
        return (Generator, *Original.__reduce__(gen)[1:])

    p.set(torch, "Generator", Generator)
    p.set_item(copyreg.dispatch_table, Original, reduce)


def _patch_load(p: Any, mapper: DeviceMapper) -> None:
    orig_load = torch.load

    def cuda_location(storage: Any, location: str) -> Any:
        if location.startswith("cuda"):
            dev = mapper.device(_index_of(location))
            return storage if dev.type == "cpu" else storage.to(device=dev)
        return None  # torch's default restore for every other location

    @functools.wraps(orig_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        # onto the device: its float16 tensors take the dtype policy's dtype (redirect/dtype_policy.py)
        onto = mapper.half_as is not None and (map_location is None or mapper.is_cuda(map_location))
        if map_location is None:
            map_location = cuda_location
        elif isinstance(map_location, (str, _DEVICE)):
            map_location = mapper.map(map_location, f"torch.load(map_location={_spell(map_location)})")
        elif isinstance(map_location, dict):
            table = {k: v for k, v in map_location.items()}

            def from_dict(storage: Any, location: str) -> Any:
                loc = str(table.get(location, location))
                if loc.startswith("cuda") or loc == location:
                    return cuda_location(storage, loc)  # None: torch restores `location` itself
                return torch.serialization.default_restore_location(storage, loc)

            mapper.log.record("device", "torch.load(map_location={...})", str(mapper.device(None)), depth=3)
            map_location = from_dict
        elif callable(map_location):
            user_fn = map_location

            def wrapped(storage: Any, location: str) -> Any:
                result = user_fn(storage, location)
                return cuda_location(storage, location) if result is None else result

            map_location = wrapped
        out = orig_load(f, map_location, *args, **kwargs)
        return dtype_policy.loaded(mapper, out, "torch.load() of float16 tensors onto the device") if onto else out

    p.set(torch, "load", load)
    if getattr(torch.serialization, "load", None) is orig_load:  # torch.load is re-exported from there
        p.set(torch.serialization, "load", load)


def _patch_storages(p: Any, mapper: DeviceMapper) -> None:
    """``Storage.cuda()`` and ``torch.UntypedStorage(..., device="cuda")`` (``torch.TypedStorage``
    makes its storage through it): the target's device. ``.cuda()`` is ``.to(device=target)``, as
    torch's is ``.to(device="cuda")``: no copy where the storage is already there, a copy from
    elsewhere (a meta storage raises "Cannot copy out of meta tensor", as it does on CUDA)."""
    def make(cls: type) -> Any:
        def cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
            dev = mapper.device(device if type(device) is int else None)
            mapper.log.record("device", f"{cls.__name__}.cuda()", str(dev), depth=3)
            return self.to(device=dev, non_blocking=non_blocking)

        return cuda

    for cls in (torch.UntypedStorage, torch.TypedStorage):
        p.set(cls, "cuda", make(cls))

    untyped, base_new = torch.UntypedStorage, torch._C.StorageBase.__new__

    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        dev = kwargs.get("device")
        if dev is not None and (type(dev) is int or mapper.is_cuda(dev)):
            kwargs["device"] = mapper.map(dev, f"torch.UntypedStorage(device={_spell(dev)})", ints=True)
        return base_new(cls, *args, **kwargs)

    p.set(untyped, "__new__", staticmethod(caller_warnings.pass_through(new)))

    def share_cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
        # CUDA IPC of a storage: torch.multiprocessing asks for it only of CUDA storages, and no
        # storage is CUDA's on this target: CUDA's answer for any other ("CUDA is not available" on a
        # CPU build — the program was told it is)
        raise RuntimeError("_share_cuda_: only available on CUDA")

    p.set(untyped, "_share_cuda_", share_cuda)
