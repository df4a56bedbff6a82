"""``torch.cuda`` answered for the target.

Every name in ``torch.cuda.__all__`` has a row in :data:`TABLE` (how it is answered, in
words) and the names that need one get a stand-in built by :class:`StandIn`. On a real
non-CUDA target (npu, xpu, mps) a stand-in delegates to ``torch.<target>`` when that
module has the same function; on the CPU target it answers from the host (see
:mod:`.host_memory` for memory). Names that cannot mean anything off CUDA raise
:class:`~torch_adapter.errors.UnsupportedCudaFeature` saying why and what to use.

The patches are set on the real ``torch.cuda`` module (and its submodules that define
the same names), so ``import torch.cuda as tc`` made before install sees them too.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import platform
import sys
from typing import Any, Callable

import torch
from torch.compiler import is_compiling as _compiling

from ..core.patching import STAND_IN, mark_stand_in
from ..errors import UnsupportedCudaFeature, format_error
from . import cuda_graphs, host_memory
from .cuda_objects import DeviceProperties, _Event, _Stream
from .cuda_table import _FIXES, TABLE, A, E, K, U

__all__ = ["TABLE", "StandIn", "apply", "table_markdown"]

from .cuda_table import table_markdown  # noqa: E402  (re-exported: docs and tests use it)

def _legacy_tensor_class(dtype_name: str, mapper: Any) -> type:
    cpu_cls = getattr(torch, dtype_name)
    legacy = f"torch.cuda.{dtype_name}"
    dtype = cpu_cls.dtype if hasattr(cpu_cls, "dtype") else torch.tensor([], dtype=None).dtype

    class _Meta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, torch.Tensor) and obj.dtype == dtype and obj.device.type == mapper.type

    def new(cls: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        # device= names a CUDA device (the CPU class's constructor refuses any other than the CPU, so
        # it is taken off here): on a device target one of another type is refused with CUDA's error.
        asked = kwargs.pop("device", None)
        target = mapper.device(None)
        if asked is not None:
            kind = asked if type(asked) is int else torch.device(asked)
            if type(kind) is int or kind.type == "cuda":
                target = mapper.map(asked, f"{legacy}(device={asked!r})", ints=True)
            elif not mapper.on_cpu:  # (the CPU target: "cuda" is the CPU, a CPU device names it)
                raise RuntimeError(f"legacy constructor expects device type: cuda but device type: {kind.type} "
                                   "was passed")
        mapper.log.record("device", f"{legacy}(...)", f"{dtype} on {target}", depth=3)
        t = cpu_cls(*args, **kwargs)
        return t if mapper.on_cpu else t.to(target)

    return _Meta(dtype_name, (), {"__new__": new, "__torch_adapter_legacy__": legacy, "dtype": dtype,
                                  "__doc__": f"{legacy}, answered by torch_adapter on the target."})


def _unsupported(name: str, original: Any) -> Any:
    """A stand-in that raises when used. Classes stay classes (``torch.cuda.CUDAGraph | None``
    annotations, ``isinstance`` checks and subclassing keep working); only making one raises."""
    why = TABLE[name][1]

    # Any call raises the reason (even one torch would refuse with a TypeError: "unsupported
    # here" is what the user needs to know first); introspection sees the original's parameters.
    sig = _signature(original)

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedCudaFeature(format_error(
            f"torch.cuda.{name}", "a CUDA device", "a torch_adapter target without CUDA",
            why=f"{name}: {why}", fix=_FIXES.get(name, "guard this call with torch.version.cuda, or remove it")))

    if isinstance(original, type):
        class _Meta(type):
            def __instancecheck__(cls, obj: Any) -> bool:
                return isinstance(obj, original)

            def __subclasscheck__(cls, sub: type) -> bool:
                return issubclass(sub, original)

        def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            return fail(*args, **kwargs)

        return _Meta(name, (), {"__new__": __new__, "__doc__": f"torch.cuda.{name}: unsupported off CUDA ({why}).",
                                "__module__": "torch.cuda", STAND_IN: original,
                                "__signature__": sig})
    fail.__name__ = name
    fail.__qualname__ = name
    fail.__signature__ = sig  # type: ignore[attr-defined]
    return fail


def _cpu_device_count(session: Any) -> int:
    """The CUDA device count where every CUDA index names the CPU: the session's ``device_count``
    when set (read per call: ``configure(device_count=...)`` takes effect at once); else one, or
    under a launcher one per local rank (``LOCAL_WORLD_SIZE`` from torchrun / accelerate launch, the MPI
    launchers' local size: core/launcher_env.py),
    so a program that checks it has a device per rank (``device_count() >= world_size``) runs."""
    asked = session.config.device_count
    if asked is not None:
        return asked
    from ..core.launcher_env import local_world_size  # LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, ...

    return local_world_size()


def _signature(fn: Any) -> inspect.Signature | None:
    """How ``fn`` is called (a class: its constructor), or None when it has no Python signature."""
    try:
        return inspect.signature(fn) if fn is not None else None
    except (TypeError, ValueError):
        return None


def _cuda_target_arg(arg: Any, mapper: Any, call: str) -> Any:
    """``arg`` as the target's device where it names a CUDA one (a ``cuda`` string or torch.device)."""
    if (type(arg) is str and arg.startswith("cuda")) or (isinstance(arg, torch.device) and arg.type == "cuda"):
        return mapper.map(arg, call)
    return arg


def _on_target(fn: Any, name: str, mapper: Any) -> Any:
    """The device module's ``fn`` (a function or a class) called with the target's device where the program
    names a CUDA one. A class stays one for ``isinstance`` and subclass checks (torch.cuda.Stream)."""
    import functools

    call = f"torch.cuda.{name}(device)"

    def make(*args: Any, **kwargs: Any) -> Any:
        return fn(*[_cuda_target_arg(a, mapper, call) for a in args],
                  **{k: _cuda_target_arg(v, mapper, call) for k, v in kwargs.items()})

    if not isinstance(fn, type):
        functools.update_wrapper(make, fn)
        return make

    class _Meta(type(fn)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, fn)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, fn)

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
        return make(*args, **kwargs)

    return _Meta(name, (), {"__new__": __new__, "__module__": "torch.cuda", STAND_IN: fn,
                            "__doc__": f"torch.cuda.{name}: the target's {getattr(fn, '__qualname__', name)} "
                                       "(a CUDA device argument names the target's)"})


class _CudaShapedProperties:
    """The target device's properties with the fields CUDA's have that the device's lack (major, minor,
    gcnArchName, ...: DeviceProperties' values, major/minor from get_device_capability). CUDA-written code
    reads them: inductor's cache key reads gcnArchName where torch.version.cuda is None, and programs gate
    kernels on ``major`` (denoising-diffusion-pytorch's Attend: 'no attribute major' on the npu)."""

    def __init__(self, props: Any, capability: tuple[int, int]) -> None:
        self._props = props
        self._cuda = DeviceProperties(name=str(getattr(props, "name", "")),
                                      total_memory=int(getattr(props, "total_memory", 0) or 0),
                                      multi_processor_count=int(getattr(props, "multi_processor_count", 0) or 0),
                                      major=int(capability[0]), minor=int(capability[1]), is_integrated=False)

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._props, name)
        except AttributeError:
            return getattr(self._cuda, name)

    def __repr__(self) -> str:
        return repr(self._props)


def _cuda_shaped(get_properties: Callable[..., Any], get_capability: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    def get_device_properties(device: Any = None) -> Any:
        props = get_properties(device)
        return props if isinstance(props, DeviceProperties) else _CudaShapedProperties(props, get_capability(device))

    functools.update_wrapper(get_device_properties, get_properties)
    return get_device_properties


class StandIn:
    """Builds the stand-in namespace for one session."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.mapper = session.device_mapper
        self.target = session.target
        self.dev_mod = None if self.mapper.on_cpu else getattr(torch, self.target.device_type, None)
        self.fraction = 1.0

    def _delegate(self, name: str, cpu_impl: Callable[..., Any]) -> Callable[..., Any]:
        """The device module's ``name`` where it has one, else ``cpu_impl``. The device module is handed
        the target's device where the program named a CUDA one (``torch.cuda.get_device_name(
        torch.device("cuda", 0))`` reaches ``torch.npu.get_device_name(npu:0)``: torch_npu, like the
        emulated npu, refuses a cuda device)."""
        fn = getattr(self.dev_mod, name, None) if self.dev_mod is not None else None
        if not callable(fn):
            return cpu_impl
        mapper = self.mapper

        def mapped(arg: Any) -> Any:
            if (type(arg) is str and arg.startswith("cuda")) or (isinstance(arg, torch.device) and arg.type == "cuda"):
                return mapper.map(arg, f"torch.cuda.{name}(device)")
            return arg

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*[mapped(a) for a in args], **{k: mapped(v) for k, v in kwargs.items()})

        return call

    def names(self) -> dict[str, Any]:
        """Every name of the stand-in namespace: torch.cuda's answers for the target."""
        ns: dict[str, Any] = {}
        for part in (self._device_names, self._info_names, self._stream_names, self._rng_names,
                     self._memory_names, self._legacy_names):
            part(ns)
        return ns

    def _device_names(self, ns: dict[str, Any]) -> None:
        """Availability, the current device and the device context managers."""
        m, d = self.mapper, self._delegate
        cpu = m.on_cpu
        ns["is_available"] = lambda: True
        # the target's runtime state where it has one (DeviceMesh sets the device to LOCAL_RANK only
        # while torch.cuda.is_initialized() is False); the CPU has no runtime to initialise
        ns["is_initialized"] = d("is_initialized", lambda: True)
        ns["init"] = d("init", lambda: None)
        ns["_lazy_init"] = d("_lazy_init", lambda: None)
        session = self.session

        def device_count() -> int:
            return _cpu_device_count(session)

        ns["device_count"] = d("device_count", device_count)

        def current_device() -> int:
            return m.logical_index

        def set_device(device: Any) -> None:
            index = device if type(device) is int else getattr(m.map(device, "torch.cuda.set_device"), "index", 0)
            m.logical_index = int(index or 0) if index is not None and index >= 0 else 0
            if not cpu and self.dev_mod is not None:
                self.dev_mod.set_device(m.logical_index)

        ns["current_device"] = current_device if cpu else d("current_device", current_device)
        ns["set_device"] = set_device

        class device:  # noqa: N801 - torch's spelling
            """Context manager that selects a logical CUDA index (torch_adapter)."""

            def __init__(self, device: Any) -> None:
                idx = device if type(device) is int else getattr(m.map(device, "torch.cuda.device"), "index", None)
                self.idx = -1 if idx is None else idx
                self.prev_idx = 0  # torch's attribute names: a pickled one loads as torch's

            def __enter__(self) -> None:
                self.prev_idx = m.logical_index
                if self.idx >= 0:
                    set_device(self.idx)

            def __exit__(self, *exc: Any) -> bool:
                set_device(self.prev_idx)
                return False

        class device_of(device):  # noqa: N801
            def __init__(self, obj: Any) -> None:
                super().__init__(obj.get_device() if getattr(obj, "is_cuda", False) else -1)

        ns["device"], ns["device_of"] = device, device_of

    def _info_names(self, ns: dict[str, Any]) -> None:
        """The device's description, capabilities and no-op switches."""
        d = self._delegate
        name = f"CPU ({platform.processor() or platform.machine()}) via torch_adapter"
        ns["get_device_name"] = d("get_device_name", lambda device=None: name)
        ns["get_device_capability"] = d("get_device_capability", lambda device=None: (0, 0))
        ns["get_device_properties"] = d("get_device_properties", lambda device=None: DeviceProperties(
            name=name, total_memory=host_memory.total(), multi_processor_count=os.cpu_count() or 1))
        if self.dev_mod is not None and callable(getattr(self.dev_mod, "get_device_properties", None)):
            ns["get_device_properties"] = _cuda_shaped(ns["get_device_properties"], ns["get_device_capability"])
        ns["get_arch_list"] = lambda: []
        ns["get_gencode_flags"] = lambda: ""
        ns["synchronize"] = d("synchronize", _synchronize)
        ns["can_device_access_peer"] = lambda device, peer_device: False
        ns["check_error"] = _check_error
        ns["has_half"], ns["has_magma"] = True, False
        ns["is_bf16_supported"] = d("is_bf16_supported", lambda including_emulation=True: True)
        ns["is_tf32_supported"] = lambda: False
        ns["get_sync_debug_mode"] = lambda: 0
        ns["set_sync_debug_mode"] = lambda debug_mode: None
        ns["ipc_collect"] = lambda: None
        ns["get_allocator_backend"] = lambda: "native"
        ns["caching_allocator_enable"] = lambda value=True: None
        ns["caching_allocator_disabled"] = lambda: contextlib.nullcontext()
        ns["list_gpu_processes"] = lambda device=None: f"torch_adapter target {self.target.label}: process {os.getpid()}"
        ns.update(cuda_graphs.names(self.dev_mod))
        ns["utilization"] = lambda device=None: 0
        ns["memory_usage"] = lambda device=None: 0

    def _stream_names(self, ns: dict[str, Any]) -> None:
        """Streams and events: the CPU target's one synchronous stream, else the device module's."""
        cpu = self.mapper.on_cpu
        if cpu:
            Stream, Event = _Stream, _Event
            default = _Stream()
            ns["current_stream"] = lambda device=None: default
            ns["default_stream"] = lambda device=None: default
            ns["set_stream"] = lambda stream: None

            @contextlib.contextmanager
            def stream(stream: Any) -> Any:
                yield stream

            ns["stream"] = stream

            class StreamContext:
                def __init__(self, stream: Any) -> None:
                    self.stream = stream

                def __enter__(self) -> Any:
                    return self.stream

                def __exit__(self, *exc: Any) -> bool:
                    return False

            ns["StreamContext"] = StreamContext
        else:
            # the device's own, handed the target's device where the program names a CUDA one: timm's
            # prefetcher makes torch.cuda.Stream(device=torch.device("cuda")), which torch.npu.Stream refuses
            Stream = _on_target(getattr(self.dev_mod, "Stream", torch.Stream), "Stream", self.mapper)
            Event = getattr(self.dev_mod, "Event", torch.Event)
            for n in ("current_stream", "default_stream", "set_stream", "stream", "StreamContext"):
                if hasattr(self.dev_mod, n):
                    fn = getattr(self.dev_mod, n)
                    ns[n] = _on_target(fn, n, self.mapper) if n in ("current_stream", "default_stream") else fn
        ns["Stream"], ns["Event"] = Stream, Event

    def _rng_names(self, ns: dict[str, Any]) -> None:
        """The RNG: the target's default generator."""
        d, cpu = self._delegate, self.mapper.on_cpu
        gen = torch.default_generator
        ns["manual_seed"] = d("manual_seed", lambda seed: gen.manual_seed(int(seed)) and None)
        ns["manual_seed_all"] = d("manual_seed_all", lambda seed: gen.manual_seed(int(seed)) and None)
        ns["seed"] = d("seed", lambda: gen.seed() and None)
        ns["seed_all"] = d("seed_all", lambda: gen.seed() and None)
        ns["initial_seed"] = d("initial_seed", lambda: gen.initial_seed())
        ns["get_rng_state"] = d("get_rng_state", lambda device="cuda": gen.get_state())
        ns["get_rng_state_all"] = d("get_rng_state_all", lambda: [gen.get_state()])
        ns["set_rng_state"] = d("set_rng_state", lambda new_state, device="cuda": gen.set_state(new_state))
        ns["set_rng_state_all"] = d("set_rng_state_all",
                                    lambda new_states: gen.set_state(list(new_states)[0]))
        ns["default_generators"] = (getattr(self.dev_mod, "default_generators", None) if not cpu else None) or (gen,)

    def _memory_names(self, ns: dict[str, Any]) -> None:
        """Memory statistics, from the host (redirect/host_memory.py) on the CPU target."""
        d = self._delegate
        hm = host_memory
        for n, impl in {
            "memory_allocated": lambda device=None: hm.allocated(),
            "max_memory_allocated": lambda device=None: hm.peak_allocated(),
            "memory_reserved": lambda device=None: hm.reserved(),
            "max_memory_reserved": lambda device=None: hm.peak_reserved(),
            "memory_cached": lambda device=None: hm.reserved(),
            "max_memory_cached": lambda device=None: hm.peak_reserved(),
            "reset_peak_memory_stats": lambda device=None: hm.reset_peak(),
            "reset_max_memory_allocated": lambda device=None: hm.reset_peak(),
            "reset_max_memory_cached": lambda device=None: hm.reset_peak(),
            "reset_accumulated_memory_stats": lambda device=None: None,
            "empty_cache": hm.empty_cache,
            "mem_get_info": lambda device=None: hm.mem_info(),
            "memory_stats": lambda device=None: hm.stats(),
            "memory_stats_as_nested_dict": lambda device=None: _nest(hm.stats()),
            "memory_summary": lambda device=None, abbreviated=False: hm.summary(),
            "memory_snapshot": lambda mempool_id=None, include_traces=True: [],
            "device_memory_used": lambda device=None: hm.reserved(),
            "host_memory_stats": lambda: {},
            "host_memory_stats_as_nested_dict": lambda: {},
            "reset_accumulated_host_memory_stats": lambda: None,
            "reset_peak_host_memory_stats": lambda: None,
        }.items():
            ns[n] = d(n, impl)

        def set_fraction(fraction: float, device: Any = None) -> None:
            self.fraction = float(fraction)

        ns["set_per_process_memory_fraction"] = d("set_per_process_memory_fraction", set_fraction)
        ns["get_per_process_memory_fraction"] = lambda device=None: self.fraction

    def _legacy_names(self, ns: dict[str, Any]) -> None:
        """Legacy typed tensors and storages; the unsupported names."""
        m = self.mapper
        for n in TABLE:
            if n.endswith("Tensor"):
                ns[n] = _legacy_tensor_class(n, m)
            elif n.endswith("Storage") and hasattr(torch, n):
                # the target's legacy storage class where its module has one (torch_npu's torch.npu.FloatStorage:
                # what ``tensor.storage_type()`` answers for its tensors), else the host's
                ns[n] = getattr(self.dev_mod, n, None) or getattr(torch, n)

        for n, (how, _) in TABLE.items():
            if how == U and not inspect.ismodule(getattr(torch.cuda, n, None)):
                ns[n] = _unsupported(n, getattr(torch.cuda, n, None))


# Unsupported *modules* stay the real module (every name torch.cuda.<module> has is still there:
# ``torch.testing._internal.common_methods_invocations`` builds jiterator OpInfos at import);
# their factories build objects as on CUDA, and what they build raises when called.
_DEFERRED_FACTORIES = {"jiterator": ("_create_jit_fn", "_create_multi_output_jit_fn")}


def _deferred_factory(module: str, name: str, original: Any) -> Callable[..., Any]:
    """``original`` (a factory) whose product raises the adapter's error when it is called."""
    def factory(*args: Any, **kwargs: Any) -> Any:
        def launch(*a: Any, **k: Any) -> Any:
            return _unsupported(module, None)(*a, **k)

        launch.__name__ = launch.__qualname__ = f"{module}.{name}(...)"
        return launch

    factory.__name__ = factory.__qualname__ = name
    factory.__signature__ = _signature(original)  # type: ignore[attr-defined]
    return mark_stand_in(factory, original)


def _check_error(res: int) -> None:
    if res != 0:
        raise RuntimeError(f"torch.cuda.check_error({res}): a CUDA error code on a target without CUDA")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _synchronize(device: Any = None) -> None:
    cuda_graphs.check_not_capturing("torch.cuda.synchronize()")


def _nvtx_patches(session: Any) -> dict[str, Any]:
    stack: list[Any] = []

    def range_push(msg: str) -> int:
        rf = torch.profiler.record_function(msg)
        rf.__enter__()
        stack.append(rf)
        return len(stack) - 1

    def range_pop() -> int:
        if stack:
            stack.pop().__exit__(None, None, None)
        return len(stack)

    @contextlib.contextmanager
    def range_(msg: str, *args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(msg.format(*args, **kwargs)):
            yield

    def mark(msg: str) -> None:
        with torch.profiler.record_function(f"mark: {msg}"):
            pass

    def range_start(msg: str) -> int:
        return range_push(msg)

    def range_end(range_id: int) -> None:
        range_pop()

    return {"range_push": range_push, "range_pop": range_pop, "range": range_, "mark": mark,
            "range_start": range_start, "range_end": range_end}


def _became(name: str, session: Any) -> str:
    """What a call of ``torch.cuda.<name>`` became, in the migration log's words: on the CPU target the
    table's row (where it says the call does nothing, the log's class is "dummy": core/codes.py,
    TA-X014); on a device target the device module's function where it has one."""
    what = TABLE.get(name, (A, "the target's answer"))[1]
    if session.device_mapper.on_cpu:
        return what
    device_type = session.target.device_type
    dev_mod = getattr(torch, device_type, None)
    return f"torch.{device_type}.{name}()" if callable(getattr(dev_mod, name, None)) else what


def _logged(name: str, value: Any, session: Any) -> Any:
    """``value`` (a stand-in function of torch.cuda) recording each call in the migration log, once per
    site with a count; classes, modules and other values are returned as they are."""
    if not inspect.isfunction(value) or name.startswith("_") or TABLE.get(name, (K,))[0] not in (A, E):
        return value
    log = session.redirect_log
    asked, became, calls, first_call = f"torch.cuda.{name}()", _became(name, session), log.calls, log.first_call

    @functools.wraps(value)
    def logged(*args: Any, **kwargs: Any) -> Any:
        # the program's own calls, once per line with a count (torch and libraries asking for themselves
        # are not logged: a library's is_available() per step would flood the log); nothing while
        # dynamo traces (a frame lookup there is a graph break)
        if not _compiling():
            caller = sys._getframe(1)
            # keyed by the call instruction (a line number costs a line-table walk per call); the code
            # object is kept with its row, so an id reused after a cell is redefined is told apart
            seen = calls.get((id(caller.f_code), caller.f_lasti, asked))
            if seen is None or seen[0] is not caller.f_code:
                first_call("namespace", asked, became, caller)
            elif seen[1] is not None:
                seen[1].count += 1
        return value(*args, **kwargs)

    return logged


def apply(session: Any) -> None:
    """Patch torch.cuda (and submodules defining the same names) for ``session``'s target."""
    if session.target.device_type == "cuda":
        return  # real CUDA answers for itself
    p = session.patcher
    ns = StandIn(session).names()
    if getattr(session, "redirect_log", None) is not None:  # the migration log: each torch.cuda call, per site
        ns = {name: _logged(name, value, session) for name, value in ns.items()}
    submodules = [getattr(torch.cuda, s) for s in ("memory", "random", "graphs", "streams") if hasattr(torch.cuda, s)]
    for name, value in ns.items():
        p.set(torch.cuda, name, value)
        for sub in submodules:
            if name in vars(sub):
                p.set(sub, name, value)
    if ns["CUDAGraph"] is cuda_graphs.CUDAGraph:
        cuda_graphs.capturable_optimizers(session)
    for module, factories in _DEFERRED_FACTORIES.items():
        mod = getattr(torch.cuda, module, None)
        for name in factories:
            if mod is not None and hasattr(mod, name):
                p.set(mod, name, _deferred_factory(module, name, getattr(mod, name)))
    for name, value in _nvtx_patches(session).items():
        p.set(torch.cuda.nvtx, name, value)
    profiler_mod = getattr(torch.cuda, "profiler", None)
    if profiler_mod is not None:
        p.set(profiler_mod, "start", lambda: None)
        p.set(profiler_mod, "stop", lambda: None)
        p.set(profiler_mod, "profile", lambda: contextlib.nullcontext())

