"""Custom ops keyed "cuda" run on the CPU target while installed (redirect/custom_ops.py).

Each registration form, before install and during the session: forward, autograd
(register_autograd), torch.library.opcheck, torch.compile(backend="aot_eager"), and after
uninstall the NotImplementedError plain CPU torch raises. Without the adapter's kernel the
forward on the (CPU) tensors is that NotImplementedError, so every test here fails without it.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

import torch_adapter

_ids = itertools.count()


def _fake_and_autograd(qualname: str) -> None:
    torch.library.register_fake(qualname, lambda x: torch.empty_like(x))

    def backward(ctx: object, grad: Tensor) -> Tensor:
        return grad * 3

    torch.library.register_autograd(qualname, backward)


def _times3(x: Tensor) -> Tensor:
    return x * 3


def _define(form: str) -> tuple[str, list]:
    """An op ``ns::f(x) = 3x`` whose only kernel is for CUDA, registered as ``form``."""
    ns = f"tcuda{next(_ids)}"
    qualname = f"{ns}::f"
    keep: list = []  # Library handles (a Library is destroyed when collected)
    if form == "custom_op":
        torch.library.custom_op(qualname, _times3, mutates_args=(), device_types="cuda")
    elif form == "register_kernel":
        op = torch.library.custom_op(qualname, mutates_args=(), device_types="mps")(_times3)
        op.register_kernel("cuda")(_times3)
    elif form in ("library_impl_CUDA", "library_impl_cuda"):
        lib = torch.library.Library(ns, "DEF")
        lib.define("f(Tensor x) -> Tensor")
        keep.append(lib)
        torch.library.impl(qualname, "CUDA" if form.endswith("CUDA") else "cuda", _times3, lib=lib)
    else:  # Library(...).impl(name, fn, "CUDA")
        lib = torch.library.Library(ns, "DEF")
        lib.define("f(Tensor x) -> Tensor")
        lib.impl("f", _times3, "CUDA")
        keep.append(lib)
    _fake_and_autograd(qualname)
    return qualname, keep


FORMS = ["custom_op", "register_kernel", "library_impl_CUDA", "library_impl_cuda", "Library.impl"]


@pytest.mark.parametrize("when", ["before_install", "during_session"])
@pytest.mark.parametrize("form", FORMS)
def test_cuda_kernel_serves_the_target_and_is_gone_after_uninstall(form, when):
    if when == "during_session":
        torch_adapter.install("cpu")
    qualname, keep = _define(form)
    if when == "before_install":
        torch_adapter.install("cpu")
    op = torch._library.utils.lookup_op(qualname)
    x = torch.randn(4, device="cuda", requires_grad=True)
    y = op(x)
    y.sum().backward()
    assert torch.equal(y, x.detach() * 3) and torch.equal(x.grad, torch.full((4,), 3.0))
    torch.library.opcheck(op, (torch.randn(3, device="cuda", requires_grad=True),))
    torch._dynamo.reset()  # one code object compiled per parametrization: no recompile limit
    compiled = torch.compile(lambda t: op(t) + 1, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(torch.ones(2, device="cuda")), torch.full((2,), 4.0))
    assert torch_adapter.explain(qualname).route.value == "native"
    torch_adapter.uninstall()
    with pytest.raises(NotImplementedError, match="Could not run"):
        op(torch.ones(2))
    assert keep is not None


def test_the_op_runs_through_routing_like_any_op():
    qualname, keep = _define("custom_op")
    torch_adapter.install("cpu")
    with torch_adapter.trace(use_observer=False) as log:
        torch._library.utils.lookup_op(qualname)(torch.ones(2, device="cuda"))
    assert log.routes().get(qualname) == "native"


def test_a_later_kernel_of_its_own_for_the_target_wins_and_stays():
    torch_adapter.install("cpu")
    op = torch.library.custom_op(f"tcuda{next(_ids)}::f", _times3, mutates_args=(), device_types="cuda")
    assert torch.equal(op(torch.ones(1)), torch.full((1,), 3.0))
    op.register_kernel("cpu")(lambda x: x + 100)
    assert torch.equal(op(torch.ones(1)), torch.full((1,), 101.0))
    torch_adapter.uninstall()
    assert torch.equal(op(torch.ones(1)), torch.full((1,), 101.0))  # the program's own CPU kernel


def _plus1(x: Tensor) -> Tensor:
    return x + 1


def test_cuda_kernel_beats_a_device_generic_default_as_on_cuda():
    op = torch.library.custom_op(f"tcuda{next(_ids)}::f", _plus1, mutates_args=())
    op.register_kernel("cuda")(_times3)
    torch_adapter.install("cpu")
    assert torch.equal(op(torch.ones(1, device="cuda")), torch.full((1,), 3.0))
    torch_adapter.uninstall()
    assert torch.equal(op(torch.ones(1)), torch.full((1,), 2.0))


def test_a_kernel_for_a_device_the_target_cannot_serve_is_a_clear_error_at_the_call():
    """Registration is accepted (libraries register kernels for several devices, in any order);
    the call names the op, the kernels it has, the target and the fix."""
    torch_adapter.install("cpu")
    op = torch.library.custom_op(f"tcuda{next(_ids)}::f", _times3, mutates_args=(), device_types="mps")
    op.register_kernel("xpu")(_times3)
    with pytest.raises(NotImplementedError) as info:
        op(torch.ones(1, device="cuda"))
    text = str(info.value)
    assert "::f on cpu" in text and "MPS, XPU only" in text and 'register_kernel("cuda")' in text
    op.register_kernel("cuda")(_times3)  # a CUDA kernel registered later serves the target
    assert torch.equal(op(torch.ones(1, device="cuda")), torch.full((1,), 3.0))


def test_a_removed_cuda_kernel_is_not_served():
    torch_adapter.install("cpu")
    ns = f"tcuda{next(_ids)}"
    defs = torch.library.Library(ns, "DEF")
    defs.define("f(Tensor x) -> Tensor")
    lib = torch.library.Library(ns, "IMPL")
    lib.impl("f", _times3, "CUDA")
    op = torch._library.utils.lookup_op(f"{ns}::f")
    assert torch.equal(op(torch.ones(1)), torch.full((1,), 3.0))
    lib._destroy()  # the CUDA kernel's Library: the op keeps its definition, loses the kernel
    with pytest.raises(NotImplementedError):
        op(torch.ones(1))
