"""Custom ops with a "cuda" kernel run on the target while installed.

A program (or a library it imports) registers its op's GPU kernel for CUDA:
``@op.register_kernel("cuda")``, ``torch.library.custom_op(..., device_types="cuda")``,
``torch.library.impl("ns::op", "CUDA")`` or ``Library(...).impl(name, fn, "CUDA")``. On the
target the tensors are the target's, so the dispatcher looks for the target's key (``CPU``
here) and finds nothing: NotImplementedError. Every one of those forms ends in
``torch.library.Library.impl``; torch keeps the result in the dispatcher (custom_op also keeps
its Python functions in ``torch._library.custom_ops.OPDEFS[...]._backend_fns``).

While installed, an op that has a Python CUDA kernel and no kernel of its own for the
target's key (none registered directly there: a CUDA program's "cuda" tensors run the CUDA
kernel, not a device-generic default the op may also have) gets one, in a ``torch.library``
Library the session owns: it calls the op's CUDA kernel as the dispatcher would
(``torch.library.get_kernel(op, "CUDA").call_boxed``, looked up at each call, so a later
``register_kernel("cuda")`` is what runs). Ops registered before install are found in the
dispatcher at install; registrations during the session through ``Library.impl`` (patched
for the session). A kernel of the op's own for the target's key registered later replaces
the session's. Uninstall destroys those Libraries: the op is
exactly as before (NotImplementedError on a CPU tensor, as plain torch).

An op whose only kernels are for device types the target cannot serve (an ``"mps"`` or
``"xpu"`` kernel on the CPU target, no CPU, CUDA or device-generic one) is accepted at registration
(libraries register kernels for several devices at import, in any order); calling it on the
target raises NotImplementedError, as torch does, with a message naming the op, the kernels
it has, the target and the fix.

**opcheck on an out-of-tree device.** ``torch.library.opcheck`` (what custom-op test suites run on
their ``"cuda"`` inputs: pytorch/extension-cpp) checks autograd registration per device, and
torch's check knows the keys of CPU, CUDA and XPU only ("NYI devices other than CPU/CUDA/XPU" --
torch_npu's users meet it too). While installed on a PrivateUse1 target (the NPU), inputs on that
device are checked at its own key, ``AutogradPrivateUse1``, by the same rules
(:func:`_autograd_registration_check`); every other input goes to torch's check.

**Routed like aten ops.** The program's own custom ops (routing/program_ops.py: defined by the
program or a library it uses, not by torch) are routed by the session's engine as aten ops are: a
custom op the target lacks really runs its CPU fallback — copies counted, the policy enforced
(``fallback="error"`` refuses it), the user's call site recorded. The patched ``Library.impl`` tells
the engine of each registration of the program's (``Engine.registered``), so an op defined, or given a
kernel, during the session is routed from then on; ops the session serves a CUDA kernel for (or
explains) keep that kernel.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import torch

from ..core import torch_private as _tp
from ..errors import format_error

__all__ = ["apply"]

_SKIP_NAMESPACES = ("aten", "prim", "prims")
_NOT_DEVICES = {"CPU", "CUDA", "Meta"}


def _qualname(lib: Any, op_name: Any) -> str:
    if _tp.is_op_overload(op_name):
        return op_name.name()
    name = str(op_name)
    return name if "::" in name else f"{lib.ns}::{name}"


class CudaKernels:
    """The session's kernels at the target's key for ops that have only a CUDA one."""

    def __init__(self, session: Any) -> None:
        self.device_type = session.target.device_type
        self.key = _tp.dispatch_key_for_device(self.device_type)
        self.foreign = {k for k in _tp.backend_dispatch_keys() if k not in _NOT_DEVICES and k != self.key}
        self.libs: dict[str, tuple[Any, str]] = {}  # op -> (Library, "cuda" | "none")
        self._lock = threading.RLock()

    # -- decisions ------------------------------------------------------------------------
    def _own_kernel(self, name: str) -> bool:
        return name not in self.libs and _tp.has_kernel_for_key(name, self.key)

    def consider(self, name: str) -> None:
        """Give ``name`` the target kernel it needs now (the CUDA one, or an explanation)."""
        if name.partition("::")[0] in _SKIP_NAMESPACES or self._own_kernel(name):
            return
        if _tp.python_kernel(name, "CUDA") is not None:
            self._register(name, "cuda")
        elif name not in self.libs and not _tp.has_computed_kernel_for_key(name, self.key) \
                and any(_tp.has_kernel_for_key(name, k) for k in self.foreign):
            self._register(name, "none")

    def drop(self, name: str) -> None:
        with self._lock:
            entry = self.libs.pop(name, None)
        if entry is not None:
            entry[0]._destroy()
            _forget_routes()

    def close(self) -> None:
        for name in list(self.libs):
            self.drop(name)

    # -- kernels ----------------------------------------------------------------------------
    def _register(self, name: str, kind: str) -> None:
        with self._lock:
            if self.libs.get(name, (None, ""))[1] == kind:
                return
            self.drop(name)
            lib = _tp.kernel_library(name.partition("::")[0])
            fn = self._serve_cuda(name) if kind == "cuda" else self._explain(name)
            _tp.register_python_kernel(lib, name, fn, self.key)
            self.libs[name] = (lib, kind)
        _forget_routes()

    def _serve_cuda(self, name: str) -> Any:
        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            cuda = _tp.python_kernel(name, "CUDA")
            if cuda is None:  # its CUDA kernel was removed since
                raise NotImplementedError(self._message(name))
            return cuda.call_boxed(keyset, *args, **kwargs)

        return kernel

    def _explain(self, name: str) -> Any:
        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(self._message(name))

        return kernel

    def _message(self, name: str) -> str:
        has = sorted(k for k in self.foreign | {"CUDA"} if _tp.has_kernel_for_key(name, k))
        return format_error(
            f"{name} on {self.device_type}", f"a kernel for cuda (served on {self.device_type} while "
            f"torch_adapter is installed), for {self.device_type}, or a device-generic one",
            f"kernels for {', '.join(has) or 'no device'} only",
            why=f"the tensors live on {self.device_type}; a kernel for another device cannot run them",
            fix=f'register one: @op.register_kernel("cuda") or ("{self.device_type}"), or '
                "custom_op(..., device_types=None) for a device-generic kernel")


def _forget_routes() -> None:
    import sys

    choose = sys.modules.get("torch_adapter.routing.choose")
    if choose is not None:
        choose.clear_caches()


def _patched_impl(kernels: CudaKernels, original: Any, session: Any) -> Any:
    @functools.wraps(original)
    def impl(self: Any, op_name: Any, fn: Any, dispatch_key: str = "", *args: Any, **kwargs: Any) -> Any:
        name = _qualname(self, op_name)
        key = dispatch_key or getattr(self, "dispatch_key", "") or "CompositeImplicitAutograd"
        ours = str(getattr(fn, "__module__", "")).startswith("torch_adapter")
        if key == kernels.key and not ours:
            kernels.drop(name)  # the program's own kernel for the target replaces the session's
        result = original(self, op_name, fn, dispatch_key, *args, **kwargs)
        if key == "CUDA" or key in kernels.foreign:
            try:
                kernels.consider(name)
            except Exception:  # noqa: BLE001 - never break the program's registration
                pass
        engine = getattr(session, "routing", None)
        if not ours and engine is not None:  # the program's op may route otherwise now (routing/program_ops.py)
            try:
                engine.registered(name, key)
            except Exception as exc:  # noqa: BLE001 - never break the program's registration: say so
                warnings.warn(f"torch_adapter: {name} is not routed on {session.target.label} after its {key} "
                              f"kernel was registered ({type(exc).__name__}: {exc}); it runs unrouted",
                              RuntimeWarning, stacklevel=2)
        return result

    return impl


def apply(session: Any) -> None:
    """Serve the CUDA kernels of custom ops on the target: those registered so far and later."""
    if session.target.device_type == "cuda":
        return
    kernels = CudaKernels(session)
    for name in _tp.all_op_names():
        if name.partition("::")[0] not in _SKIP_NAMESPACES:
            kernels.consider(name)
    original = vars(torch.library.Library)["impl"]
    session.patcher.set(torch.library.Library, "impl", _patched_impl(kernels, original, session))
    session.patcher.before_restore(lambda values: kernels.close())
    session.custom_op_kernels = kernels
    if session.target.device_type == torch._C._get_privateuse1_backend_name():
        from ..core.after_import import after_import

        after_import(session.patcher, "torch.testing._internal.optests.autograd_registration",
                     lambda module: _patch_autograd_registration(session, module))


def _patch_autograd_registration(session: Any, module: Any) -> None:
    from ..core.patching import bindings, mark_stand_in

    original = module.autograd_registration_check
    device_type = session.target.device_type

    @functools.wraps(original)
    def autograd_registration_check(op: Any, args: Any, kwargs: Any) -> None:
        return _autograd_registration_check(op, args, kwargs, device_type, original)

    stand_in = mark_stand_in(autograd_registration_check, original)
    for owner, attr, _ in bindings(original, within="torch.testing._internal.optests"):
        session.patcher.set(owner, attr, stand_in)


def _autograd_registration_check(op: Any, args: Any, kwargs: Any, device_type: str, original: Any) -> None:
    """torch's ``autograd_registration_check`` for inputs on the PrivateUse1 device (and the host): the op
    passes with a kernel at ``AutogradPrivateUse1``, ``Autograd`` or ``CompositeImplicitAutograd``, or
    when, with the autograd fallback doing nothing, no output that is not an input requires grad."""
    import torch.utils._pytree as pytree
    from torch.testing._internal.optests.autograd_registration import set_autograd_fallback_mode

    flat_args = pytree.arg_tree_leaves(*args, **kwargs)
    tensors = [a for a in flat_args if isinstance(a, torch.Tensor)]
    types = {t.device.type for t in tensors}
    if device_type not in types or not types <= {device_type, "cpu"} or not any(t.requires_grad for t in tensors):
        return original(op, args, kwargs)  # torch's own answer (and its errors)
    for key in ("AutogradPrivateUse1", "Autograd", "CompositeImplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
            return None
    with set_autograd_fallback_mode("nothing"):
        outs = op(*args, **kwargs)
    inputs = {id(a) for a in flat_args}
    if not pytree.tree_any_only(torch.Tensor, lambda t: t.requires_grad and id(t) not in inputs, outs):
        return None
    raise AssertionError(
        f"{op.name()}: at least one output of this operator has requires_grad=True but the operator does not "
        f"have an autograd kernel defined at an autograd key (e.g. DispatchKey::Autograd); register the "
        f"autograd.Function at the Autograd key, not at a backend key ({device_type}).")
