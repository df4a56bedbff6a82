"""The emulated accelerator: a real out-of-tree device on this machine, built the way torch_npu is.

``install(target="npu", emulate=True)`` (``torch-adapter run --target npu --emulate``,
``%adapter target npu --emulate``) starts it: the C++ extension ``_device.cpp`` beside this file
(built once per torch version and cached; ``python -m torch_adapter.emulated build`` builds it ahead,
as CI and the package's set-up do) registers the PrivateUse1 dispatch key's allocator, device guard,
hooks and kernels; PrivateUse1 is renamed to the target's name (``torch.utils.rename_privateuse1_backend``),
``torch.npu`` is registered as its device module (:mod:`.device_module`), the tensor methods are
generated (``Tensor.npu()``, ``is_npu``, storages), the collective backend ``hccl`` is registered
(:mod:`.collectives`), and ``import torch_npu`` works (:mod:`.vendor_package`: libraries find an NPU by
that package). From then on ``torch.empty(3, device="npu")`` is a tensor of a device type of
its own, whose memory is host memory.

What runs where (the vendor's table decides, ``../shared/target-data/ascend``):

- an op the table lists is a **device kernel**: where torch has a CPU kernel for it, that kernel on
  the device's memory (no copy; what it calls inside is not seen, as a device kernel's insides are
  not); where its only kernel is a composite one, that kernel run as the device's (its pieces on the
  device);
- an op the table does not list but a CompositeImplicitAutograd or CompositeExplicitAutograd kernel
  covers **decomposes** in the dispatcher, as on the real device;
- every other op reaches the key's **boxed fallback**: torch's own ``at::native::cpu_fallback``,
  which really copies the inputs to the host and the results back — counted, timed and sized per op
  (:func:`fallback_counts`).

The device, its name and its module are process-wide and stay for the process's life (torch cannot
rename PrivateUse1 twice, and neither can torch_npu be unloaded): uninstalling the adapter takes
its redirection off, not the device. Only ``npu`` can be emulated: ``mps``, ``xpu`` and ``cuda`` are
device types built into torch, which PrivateUse1 cannot be renamed to.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..core.cpp_build import Part
from ..errors import TargetError, format_error

__all__ = ["EMULATABLE", "NOT_EMULATABLE", "SOURCE", "Emulator", "build", "start", "active", "is_built",
           "check_emulatable", "fallback_counts", "native_counts", "kernel_ops"]

SOURCE = Path(__file__).with_name("_device.cpp")
# No stand-in: a program that asks for the emulated device gets it compiled then (said, ~30 s) when the
# install did not ship it (core/cpp_build.py's policy).
PART = Part("emulated", "torch_adapter_emulated", SOURCE, "the emulated npu device (a PrivateUse1 device)", fallback=None)

# Targets that can be emulated, and why the others cannot.
EMULATABLE = {"npu": "Ascend NPU: torch_npu's device type 'npu' on the PrivateUse1 dispatch key"}
NOT_EMULATABLE = {
    "mps": "'mps' is a device type built into torch (DeviceType::MPS): PrivateUse1 cannot be renamed to it",
    "xpu": "'xpu' is a device type built into torch (DeviceType::XPU): PrivateUse1 cannot be renamed to it",
    "cuda": "'cuda' is a device type built into torch (DeviceType::CUDA): PrivateUse1 cannot be renamed to it",
    "mtia": "'mtia' is a device type built into torch (DeviceType::MTIA): PrivateUse1 cannot be renamed to it",
    "cpu": "the CPU target already runs on this machine's own device",
}

# Ops the device handles with its own mechanisms (copies, storage, metadata), never as a wrapped kernel.
_OWN = frozenset({
    "_copy_from", "_copy_from_and_resize", "_local_scalar_dense", "empty", "empty_strided", "set_", "resize_",
    "as_strided", "view", "_reshape_alias", "alias", "unfold", "view_as_real", "view_as_complex",
    "is_pinned", "_pin_memory", "record_stream", "_has_compatible_shallow_copy_type", "is_set_to",
})
# Copies between devices: their composite kernel runs on the device (it reaches the device's _copy_from).
# _lazy_clone too: its composite kernel shares the device storage copy-on-write (through a host view the
# storage would be the view's, which torch's COW cannot wrap: "Expected storage != nullptr").
_CROSS_DEVICE = frozenset({"copy_", "_to_copy", "lift", "lift_fresh", "lift_fresh_copy", "_lazy_clone",
                           # takes its lengths on the host and returns batch_sizes there (CUDA's composite does;
                           # as an opaque kernel its host result was adopted and the host lengths refused:
                           # test_nn's test_variable_sequence, "lengths is on cpu")
                           "_pack_padded_sequence"})
# A listed op the vendor runs as one fused kernel -> the host kernels that are that kernel on this device.
# scaled_dot_product_attention: the device's _fused_sdp_choice (the C++ device's stub, where the table lists
# it) picks flash, and torch's attention then calls the host's fused kernel (routing/kernel_families.py
# labels it the table's attention, as the simulated npu does).
_REALIZED_BY = {
    "aten::scaled_dot_product_attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                           "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
}
# Ops whose CUDA kernels take host tensors among device ones (index tensors): no cross-device error.
_MIXED_OK = ("aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_")

_LOCK = threading.Lock()


@dataclass
class Emulator:
    """The emulated device of this process."""

    name: str
    ext: Any
    module: Any
    kernels: tuple[str, ...]  # ops registered as device kernels ("add.Tensor")
    not_kernels: dict[str, str] = field(default_factory=dict)  # listed op -> why it is no device kernel here
    # autograd ran before the device existed: the starting thread runs the device's backward itself
    autograd_on_calling_thread: bool = False

    @property
    def device_count(self) -> int:
        return int(self.ext.device_count())

    def set_device_count(self, n: int) -> None:
        self.ext.set_device_count(int(n))
        self.module.default_generators = tuple(self.ext.default_generator(i) for i in range(int(n)))


_ACTIVE: Emulator | None = None


def active() -> Emulator | None:
    """The emulated device started in this process, if any."""
    return _ACTIVE


def _ext_name() -> str:
    return PART.name


def is_built() -> bool:
    """The extension for this torch is built — shipped with the package or cached (no compile at the
    next start)."""
    from ..core.torch_private import is_extension_built

    return is_extension_built(_ext_name())


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if re.search(r"\berror\b", line):
            return line.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no compiler output)"


def build(*, verbose: bool = False) -> Any:
    """Build (once per torch version, cached) and import the C++ extension; a failure raises one
    TargetError with the compiler's first error line and how to retry."""
    from ..core import torch_private

    if not torch_private.can_build_extensions():
        raise TargetError(format_error(
            "torch_adapter emulated device (build)", "a C++ compiler ($CXX or c++) and ninja",
            "none found on this machine", why="the emulated device is a C++ extension of torch",
            fix="install a compiler and ninja (Debian: apt-get install -y g++ ninja-build), then retry"))
    if not is_built():  # said, never silent: the first start compiles (~30 s); prebuilt by the set-up
        import sys

        print("torch_adapter: building the emulated device (C++, once per torch version, ~30 s; "
              "`python -m torch_adapter.emulated build` does it ahead)...", file=sys.stderr, flush=True)
    try:
        return torch_private.load_extension(_ext_name(), SOURCE, verbose=verbose)
    except Exception as exc:  # a compiler error, a link error, a broken cache
        text = str(exc) + "\n" + str(getattr(exc, "output", "") or "")
        from ..core.torch_private import extension_build_dir

        raise TargetError(format_error(
            "torch_adapter emulated device (build)", f"{SOURCE.name} compiled against torch",
            _first_error(text), why="the emulated device's C++ extension did not build; nothing was installed",
            fix=(f"retry with `python -m torch_adapter.emulated build --verbose` to see the whole log; "
                 f"a stale cache is removed with `rm -rf {extension_build_dir(_ext_name())}`"))) from exc


def check_emulatable(name: str) -> None:
    """Raise TargetError unless ``name`` can be emulated here."""
    if name in NOT_EMULATABLE or name not in EMULATABLE:
        why = NOT_EMULATABLE.get(name, "torch_adapter has no emulated device and no op table for it")
        raise TargetError(format_error(
            f"torch_adapter.install(target={name!r}, emulate=True)", f"a target that can be emulated: "
            f"{', '.join(EMULATABLE)}", repr(name), why=why,
            fix=(f"emulate npu (install(target='npu', emulate=True)), or preview {name} with "
                 f"install(target={name!r}, simulate=True)")))
    from .vendor_package import is_stand_in

    if importlib.util.find_spec("torch_npu") is not None and not is_stand_in(sys.modules.get("torch_npu")):
        raise TargetError(format_error(
            f"torch_adapter.install(target={name!r}, emulate=True)", "a machine without torch_npu",
            "torch_npu is installed", why="torch_npu owns the PrivateUse1 key and the device type 'npu': "
            "an emulated npu beside it would be a second device of the same name",
            fix="use the real NPU: install(target='npu') without emulate"))
    import torch

    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", name):
        raise TargetError(format_error(
            f"torch_adapter.install(target={name!r}, emulate=True)", "PrivateUse1 free or already named "
            f"{name!r}", f"PrivateUse1 is named {current!r} in this process",
            why="another out-of-tree backend is loaded; torch has one PrivateUse1 key",
            fix="emulate in a fresh process without that backend"))


@dataclass
class KernelPlan:
    """How each op of a vendor table becomes the emulated device's kernel ("add.Tensor" spelling)."""

    host: list[str] = field(default_factory=list)  # the CPU's kernel on the device's memory (opaque)
    composite: list[str] = field(default_factory=list)  # views, copies: their CompositeExplicitAutograd kernel
    implicit: list[str] = field(default_factory=list)  # its CompositeImplicitAutograd kernel, also for autograd
    skipped: dict[str, str] = field(default_factory=dict)  # listed op -> why it is no device kernel here

    @property
    def ops(self) -> list[str]:
        return [*self.host, *self.composite, *self.implicit]


def kernel_ops(native: Iterable[str]) -> KernelPlan:
    """The plan for the ops of a vendor table: an op with a CPU or CompositeExplicitAutograd kernel runs the
    host's kernel on the device's memory, opaque as a vendor kernel is (device-selected ops such as
    convolution pick the host's implementation there, as the vendor's pick theirs); a view or a copy runs
    its composite kernel on the device; a CompositeImplicitAutograd op runs its decomposition as the
    device's kernel, for autograd too (as every dense backend without a kernel of its own does)."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    plan = KernelPlan()
    native = set(native)
    for listed, kernels in _REALIZED_BY.items():
        if listed in native:
            native.update(kernels)
    for op in sorted(native):
        base, _, overload = op.partition("::")[2].partition(".")
        short = f"{base}.{overload}" if overload else base
        if base in _OWN:
            plan.skipped[op] = "the device's own (copy, storage or metadata kernel)"
            continue
        try:
            schema = torch._C._get_schema(f"aten::{base}", overload)
        except RuntimeError:
            plan.skipped[op] = "not an op of this torch"
            continue
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        explicit = has(op, "CompositeExplicitAutograd") or has(op, "CompositeExplicitAutogradNonFunctional")
        if has(op, "PrivateUse1"):
            plan.skipped[op] = "the device's own (copy, storage or metadata kernel)"
        elif explicit and base in _CROSS_DEVICE:
            plan.composite.append(short)
        elif has(op, "CPU") or (explicit and not view):  # an opaque kernel, as the vendor's is
            plan.host.append(short)
        elif explicit:  # a view: metadata over the device's own storage
            plan.composite.append(short)
        elif has(op, "CompositeImplicitAutograd") and not has(op, "AutogradCPU"):
            plan.implicit.append(short)  # (dense backends use the decomposition for autograd too)
        else:
            plan.skipped[op] = "no kernel torch can run on this machine"
    return plan


def start(name: str, native: Iterable[str], *, device_count: int = 1) -> Emulator:
    """Start the emulated ``name`` in this process (idempotent): build, register, rename."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None:
            if _ACTIVE.name != name:
                raise TargetError(format_error(
                    f"torch_adapter.install(target={name!r}, emulate=True)", f"the emulated {_ACTIVE.name}",
                    repr(name), why="one process has one PrivateUse1 device", fix="use a fresh process"))
            if device_count != _ACTIVE.device_count:
                _ACTIVE.set_device_count(device_count)
            return _ACTIVE
        check_emulatable(name)
        import torch

        from . import device_module

        ext = build()
        ext.set_capacity(device_module.capacity_bytes())
        plan = kernel_ops(native)
        ext.set_device_count(int(device_count))
        ext.register_hooks()
        if torch._C._get_privateuse1_backend_name() != name:
            torch.utils.rename_privateuse1_backend(name)
        from . import collectives, vendor_kernels, vendor_package

        module = device_module.make(name, ext)
        torch._register_device_module(name, module)
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_packed_sequence=True,
                                                             for_storage=True)
        ext.register_native(plan.host, plan.composite, plan.implicit, list(_MIXED_OK))
        vendor_kernels.register(name)  # listed ops torch has for CUDA only (the LSTM cell torch picks on the device)
        collectives.register(name)
        vendor_package.register(name, module)  # `import torch_npu` works, as libraries ask for it (accelerate)
        _ACTIVE = Emulator(name, ext, module, tuple(plan.ops), plan.skipped)
        _ACTIVE.autograd_on_calling_thread = _autograd_probe(name)
        module._forget_init()  # the probe is the emulator's, not the program's first device use
        from . import sharing

        sharing.register(name, ext)  # device tensors to other processes through shared memory (torch_npu's IPC)
        atexit.register(_drain_autograd_threads, name, os.getpid())
        return _ACTIVE


def _autograd_probe(name: str) -> bool:
    """A backward on the device, once. torch's autograd engine sizes its per-device queues from the
    devices registered when it first runs: a device started after a first backward in this process
    (a notebook that ran CPU-target cells first) has no queue, and its backward hits an internal
    assert. Then this thread runs the device's backward itself (``set_multithreading_enabled(False)``,
    thread-local; the device computes synchronously on the host anyway). Returns whether it had to."""
    import torch

    try:
        _device_backward(name)
        return False
    except RuntimeError as exc:
        if "device_ready_queues_" not in str(exc):
            raise
    torch._C._set_multithreading_enabled(False)
    _device_backward(name)
    return True


def _device_backward(device: str, keep: list[Any] | None = None) -> None:
    """A one-element backward on ``device`` through the C++ engine directly: torch.autograd.backward
    stashes a Python context in the state its GraphTask keeps, which the device's autograd thread may
    free last (see :func:`_drain_autograd_threads`). ``keep`` receives its tensors, kept alive so that
    thread never frees the last reference of a tensor with a Python object."""
    import torch

    x = torch.ones(1, device=device, requires_grad=True)
    y = (x * 2).sum()
    grad = torch.ones_like(y)
    if keep is not None:
        keep.extend((x, y, grad))
    torch.autograd.Variable._execution_engine.run_backward(
        (y,), (grad,), False, False, (), allow_unreachable=True, accumulate_grad=True)


# Tensors of the exit drain's backward: kept for the process's life, so the device's autograd thread never
# frees the last reference of a tensor that has a Python object (that would take the GIL).
_DRAIN_KEEP: list[Any] = []


def _drain_autograd_threads(name: str, pid: int) -> None:
    """At interpreter exit (atexit: before finalization), let each of the device's autograd threads
    finish what it holds. torch's ``_engine_run_backward`` stashes a ``contextvars`` context in the
    thread-local state every backward captures; the GraphTask keeps it, and the device's autograd
    thread (one per device index, as for CUDA) can drop the last reference *after* the caller's
    backward returned, taking the GIL to free it. When the program ends within that window the thread
    meets a finalizing interpreter: ``PyThread_exit_thread`` unwinds through ~GraphTask (noexcept)
    and the process aborts ('terminate called without an active exception', exit -6) after all its
    output — seen in CI, reproduced here with a core: GraphTask -> ThreadLocalState -> SafePyObject ->
    take_gil -> pthread_exit. It is torch's engine, the same on any device with autograd threads.

    A backward through each device thread's queue (the queue is first-in first-out: when its node has
    run, the thread has finished every earlier task, its GraphTask release included), run through the
    C++ engine directly (no stashed context) with the GIL released while it waits; its own tensors are
    kept alive, so its tail needs no GIL."""
    if os.getpid() != pid or _ACTIVE is None or _ACTIVE.name != name:
        return  # a forked child (torch's engine has no threads there) or another device
    try:
        for index in range(_ACTIVE.device_count):
            try:
                _device_backward(f"{name}:{index}", _DRAIN_KEEP)
            except RuntimeError as exc:
                # torch's engine sized its device queues before the device count grew (or never ran a
                # backward on this index): it has no thread for this index, so nothing to drain there
                if "device_ready_queues_" not in str(exc):
                    raise
    except Exception as exc:  # never turn a clean exit into a failing one: say it and go on
        print(f"torch_adapter: the emulated {name}'s exit drain of autograd threads failed: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)


def fallback_counts(*, reset: bool = False) -> dict[str, tuple[int, int, int, int]]:
    """Per op that reached the device's fallback ("aten::name.overload"): (calls, nanoseconds, bytes
    copied to the host, bytes copied back to the device)."""
    return dict(_ACTIVE.ext.fallback_counts(reset)) if _ACTIVE is not None else {}


def native_counts(*, reset: bool = False) -> dict[str, tuple[int, int, int, int]]:
    """Per device-kernel op (only while counting is on): (calls, nanoseconds, 0, 0)."""
    return dict(_ACTIVE.ext.native_counts(reset)) if _ACTIVE is not None else {}
