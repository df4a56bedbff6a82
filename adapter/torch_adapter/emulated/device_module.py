"""``torch.npu`` for the emulated device: the device module torch_npu registers, answered by the
emulated device's C++ extension (its allocator's statistics, its generators, its guard).

Built per process by :func:`make`, registered with ``torch._register_device_module``; the
adapter's real-target path (``redirect/cuda_ns.py``) delegates ``torch.cuda.*`` to these names
exactly as it does to torch_npu's. Streams and events are torch's generic ``torch.Stream`` /
``torch.Event`` on the device (the guard makes them synchronous; events time with the host clock).
"""

from __future__ import annotations

import os
import platform
import types
from typing import Any

import torch

__all__ = ["make"]


def _host_total() -> int:
    """The host's physical memory: the emulated device's memory is the host's."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 0


def _host_available() -> int:
    """The host memory available now (/proc/meminfo's MemAvailable; the physical total elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return _host_total()


def capacity_bytes(environ: Any = None) -> int:
    """The emulated device's memory: ``TORCH_ADAPTER_EMULATED_MEMORY`` (bytes, or with a unit: ``8GB``,
    ``512MiB``) or half the host's physical memory. The device's memory is host memory; a fixed share
    leaves the host its own, as a real accelerator's memory is beside the host's."""
    env = os.environ if environ is None else environ
    raw = str(env.get("TORCH_ADAPTER_EMULATED_MEMORY", "")).strip()
    if not raw:
        return _host_total() // 2
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    num = raw.rstrip("BbKkMmGgTtIi")
    unit = raw[len(num):].strip().upper()
    try:
        value = float(num)
        if unit not in units or value <= 0:
            raise ValueError(unit)
    except ValueError:
        from ..errors import TargetError, format_error

        raise TargetError(format_error("TORCH_ADAPTER_EMULATED_MEMORY", "a positive size: bytes, or a number with "
                                       "a unit (KB, MB, GB, TB, KiB, MiB, GiB, TiB)", repr(raw),
                                       why="it is the emulated device's memory capacity",
                                       fix="e.g. TORCH_ADAPTER_EMULATED_MEMORY=8GB, or unset it for half the "
                                           "host's memory")) from None
    return int(value * units[unit])


def make(name: str, ext: Any) -> types.ModuleType:
    """The module ``torch.<name>`` for the emulated device driven by ``ext``."""
    mod = types.ModuleType(f"torch.{name}")
    mod.__doc__ = (f"torch.{name} of torch_adapter's emulated {name} (a PrivateUse1 device whose memory is "
                   "host memory; see torch_adapter/emulated).")

    def index(device: Any = None, *, any_type: bool = False) -> int:
        if device is None:
            return int(ext.current_device())
        if isinstance(device, int):
            return device
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != name and not any_type:
                raise ValueError(f"torch.{name}: expected a {name} device, got {device}")
            return int(ext.current_device()) if device.index is None else device.index
        raise TypeError(f"torch.{name}: expected a device index, a string or a torch.device, got {device!r}")

    def _pub(fn: Any, as_name: str | None = None) -> Any:
        setattr(mod, as_name or fn.__name__, fn)
        return fn

    # -- devices ---------------------------------------------------------------------------
    # Lazy initialisation, as torch.cuda's and torch_npu's: the runtime counts as initialised from the
    # first device tensor (torch's arg parser calls ``_lazy_init``), ``init()`` or a call that needs a
    # device (current_device, set_device, synchronize, RNG state, properties) -- not from
    # ``is_available``/``device_count``. Libraries branch on it: DeviceMesh sets the current device
    # to LOCAL_RANK only while ``is_initialized()`` is False (pytorch/examples' FSDP2 on rank 1).
    initialized = [False]

    @_pub
    def _lazy_init() -> None:
        initialized[0] = True

    def _forget_init() -> None:
        """The start-up probe's tensors do not count: not initialised, and the next device tensor
        calls ``_lazy_init`` again."""
        initialized[0] = False
        ext.rearm_lazy_init()

    mod._forget_init = _forget_init
    _pub(lambda: True, "is_available")
    _pub(lambda: initialized[0], "is_initialized")
    _pub(_lazy_init, "init")
    _pub(lambda: False, "_is_in_bad_fork")
    _pub(lambda: int(ext.device_count()), "device_count")

    @_pub
    def current_device() -> int:
        _lazy_init()
        return int(ext.current_device())

    @_pub
    def set_device(device: Any) -> None:
        i = index(device)
        if i >= 0:
            _lazy_init()
            ext.set_device(i)

    @_pub
    def synchronize(device: Any = None) -> None:
        _lazy_init()
        index(device)  # the device computes when an op is called: nothing is pending

    class device:  # noqa: N801 - torch's spelling
        """Context manager that selects a device."""

        def __init__(self, device: Any) -> None:
            self.idx = -1 if device is None else index(device)
            self.prev_idx = -1

        def __enter__(self) -> None:
            self.prev_idx = int(ext.current_device())
            if self.idx >= 0:
                ext.set_device(self.idx)

        def __exit__(self, *exc: Any) -> bool:
            if self.idx >= 0:
                ext.set_device(self.prev_idx)
            return False

    class device_of(device):  # noqa: N801
        def __init__(self, obj: Any) -> None:
            super().__init__(obj.get_device() if obj.device.type == name else -1)

    mod.device, mod.device_of = device, device_of

    @_pub
    def get_device_name(device: Any = None) -> str:
        index(device)
        return f"emulated {name} on {platform.processor() or platform.machine()} (torch_adapter)"

    @_pub
    def get_device_properties(device: Any = None) -> Any:
        _lazy_init()
        i = index(device)
        return types.SimpleNamespace(name=get_device_name(i), total_memory=int(ext.capacity()) or _host_total(),
                                     multi_processor_count=os.cpu_count() or 1, type=name, index=i)

    _pub(lambda: [torch.float16, torch.bfloat16, torch.float32], "get_amp_supported_dtype")
    _pub(lambda including_emulation=True: True, "is_bf16_supported")

    # -- torch.npu.amp: torch_npu's GradScaler and autocast (accelerate builds its scaler from
    # device_module.amp.GradScaler on npu); torch's device-generic ones on this device
    class GradScaler(torch.amp.GradScaler):
        def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                     growth_interval: int = 2000, enabled: bool = True) -> None:
            super().__init__(name, init_scale=init_scale, growth_factor=growth_factor,
                             backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)

    class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 - torch's spelling
        def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
            super().__init__(name, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    mod.amp = types.SimpleNamespace(GradScaler=GradScaler, autocast=autocast)

    # -- streams and events ----------------------------------------------------------------
    class _Generic(type):
        """isinstance(x, torch.npu.Stream) holds for torch's generic objects of the device."""

        def __instancecheck__(cls, obj: Any) -> bool:
            if not isinstance(obj, cls._base):  # type: ignore[attr-defined]
                return False
            device = getattr(obj, "device", None)
            return device is None or getattr(device, "type", name) == name

    class Stream(metaclass=_Generic):
        """A stream of the emulated device: torch's generic ``torch.Stream`` (synchronous)."""

        _base = torch.Stream

        def __new__(cls, device: Any = None, priority: int = 0) -> Any:  # type: ignore[misc]
            return torch.Stream(device=torch.device(name, index(device)), priority=priority)

    class Event(metaclass=_Generic):
        """An event of the emulated device: torch's generic ``torch.Event`` (recorded at once,
        timed with the host clock)."""

        _base = torch.Event

        def __new__(cls, enable_timing: bool = False, blocking: bool = False,  # type: ignore[misc]
                    interprocess: bool = False) -> Any:
            return torch.Event(device=torch.device(name, int(ext.current_device())), enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)

    mod.Stream, mod.Event = Stream, Event

    def _stream(device: Any = None) -> Any:
        return torch.accelerator.current_stream(torch.device(name, index(device)))

    mod.current_stream = _stream
    mod.default_stream = lambda device=None: torch.Stream(device=torch.device(name, index(device)))
    mod.set_stream = lambda stream: torch.accelerator.set_stream(stream)

    class StreamContext:
        """Selects a stream while entered (None: no change). A class, as torch.cuda's and torch_npu's are:
        torch.compile asks ``isinstance(value, torch.cuda.StreamContext)``, which the adapter answers
        with this one on the device (a function there made dynamo fail on every frame: 'isinstance()
        arg 2 must be a type')."""

        def __init__(self, stream: Any) -> None:
            self.stream = stream
            self.prev: Any = None

        def __enter__(self) -> Any:
            if self.stream is not None:
                self.prev = torch.accelerator.current_stream(self.stream.device)
                torch.accelerator.set_stream(self.stream)
            return self.stream

        def __exit__(self, *exc: Any) -> bool:
            if self.stream is not None:
                torch.accelerator.set_stream(self.prev)
            return False

    def stream(stream: Any) -> StreamContext:  # torch.cuda.stream's parameter name (timm: partial(stream=s))
        return StreamContext(stream)

    mod.stream = stream
    mod.StreamContext = StreamContext

    # -- RNG ---------------------------------------------------------------------------------
    def gen(device: Any = None) -> Any:
        # torch_npu's get_rng_state/set_rng_state take the index of any device they are handed
        # (torch.random.fork_rng(devices=["cuda:0"]) hands the accelerator's module the program's
        # "cuda:0": PyTorch's test_randperm_cuda on the device)
        _lazy_init()
        return ext.default_generator(index(device, any_type=True))

    mod.default_generators = tuple(ext.default_generator(i) for i in range(int(ext.device_count())))
    # seeding does not initialise (torch.cuda queues it until then)
    _pub(lambda seed: ext.default_generator(index()).manual_seed(int(seed)) and None, "manual_seed")
    _pub(lambda seed: [ext.default_generator(i).manual_seed(int(seed)) for i in range(ext.device_count())]
         and None, "manual_seed_all")
    _pub(lambda: gen().seed() and None, "seed")
    _pub(lambda: [ext.default_generator(i).seed() for i in range(ext.device_count())] and None, "seed_all")
    _pub(lambda: gen().initial_seed(), "initial_seed")
    _pub(lambda device=None: gen(device).get_state(), "get_rng_state")
    _pub(lambda new_state, device=None: gen(device).set_state(new_state), "set_rng_state")
    _pub(lambda: [ext.default_generator(i).get_state() for i in range(ext.device_count())], "get_rng_state_all")

    @_pub
    def set_rng_state_all(new_states: Any) -> None:
        for i, state in enumerate(new_states):
            ext.default_generator(i).set_state(state)

    mod.random = mod  # torch.npu.random.get_rng_state_all() & co. (transformers' Trainer checkpoints)

    # -- memory: the device allocator's own statistics ---------------------------------------
    def stats(device: Any = None) -> dict[str, Any]:
        return dict(ext.memory_stats(index(device)))

    _pub(stats, "memory_stats")
    _pub(lambda device=None: stats(device)["allocated_bytes.all.current"], "memory_allocated")
    _pub(lambda device=None: stats(device)["allocated_bytes.all.peak"], "max_memory_allocated")
    _pub(lambda device=None: stats(device)["reserved_bytes.all.current"], "memory_reserved")
    _pub(lambda device=None: stats(device)["reserved_bytes.all.peak"], "max_memory_reserved")
    _pub(lambda device=None: ext.reset_peak(index(device)), "reset_peak_memory_stats")
    _pub(lambda device=None: ext.reset_peak(index(device)), "reset_max_memory_allocated")
    _pub(lambda: None, "empty_cache")  # no cache: freed blocks go back to the host at once

    @_pub
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        # free: what the device has left of its capacity, at most what the host can still give
        total = int(ext.capacity()) or _host_total()
        free = max(total - stats(device)["allocated_bytes.all.current"], 0)
        return min(free, _host_available()), total

    _legacy_storages(mod, name)
    return mod


def _legacy_storages(mod: types.ModuleType, name: str) -> None:
    """``torch.<name>.FloatStorage`` & co., as torch_npu defines them: torch's ``_LegacyStorage``
    subclasses whose module is ``torch.<name>``, so ``TypedStorage._get_legacy_storage_class`` and
    ``isinstance(t.storage(), torch.<name>.FloatStorage)`` know the device's storages
    (``tensor.storage_type()`` was None for every device tensor)."""
    from torch.storage import _LegacyStorage, _dtype_to_storage_type_map
    from torch._utils import classproperty

    class _DeviceLegacyStorage(_LegacyStorage):
        @classmethod
        def from_buffer(cls, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"from_buffer: Not available for {name} storage")

        @classmethod
        def _new_with_weak_ptr(cls, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"_new_with_weak_ptr: Not available for {name} storage")

        @classmethod
        def _new_shared_filename(cls, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"_new_shared_filename: Not available for {name} storage")

    _DeviceLegacyStorage.__module__ = mod.__name__
    for dtype, storage_name in _dtype_to_storage_type_map().items():
        cls = type(storage_name, (_DeviceLegacyStorage,), {
            "__module__": mod.__name__, "__qualname__": storage_name,
            "_dtype": classproperty(lambda self, d=dtype: d),
            "dtype": classproperty(lambda self, d=dtype: d),
        })
        setattr(mod, storage_name, cls)
