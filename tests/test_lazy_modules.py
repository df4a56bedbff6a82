"""Lazy modules (``torch.nn.LazyLinear`` & co.) moved and cast under the adapter.

A lazy module's parameters are ``UninitializedParameter`` / ``UninitializedBuffer``: their
``__torch_function__`` lets through only the Tensor methods on a list torch builds at import
(``UninitializedTensorMixin._allowed_methods``: ``Tensor.to``, ``.cuda``, ``.half`` …) and refuses
every other function. torch hands a method's *current* attribute to ``__torch_function__``, which
under the adapter is the stand-in (``Tensor.to`` is a Python wrapper): the list knew only torch's
own, so ``LazyLinear(4).to("cuda")`` — and ``.to("cpu")``, ``.cuda()``, ``.half()`` — raised
"Attempted to use an uninitialized parameter in <function Tensor.to …>", where plain torch moves and
casts them lazily. The list is one of torch's tables of its functions (redirect/torch_tables.py):
the stand-ins sit beside torch's methods in it during the session, and only torch's afterwards.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, UninitializedTensorMixin

import torch_adapter
from torch_adapter.core.cpu_features import forced

MOVES = {
    "to('cuda')": lambda m: m.to("cuda"),
    "cuda()": lambda m: m.cuda(),
    "cuda(0)": lambda m: m.cuda(0),
    "to('cpu')": lambda m: m.to("cpu"),
    "half()": lambda m: m.half(),
    "to(torch.bfloat16)": lambda m: m.to(torch.bfloat16),
    "to('cuda', torch.float16)": lambda m: m.to("cuda", torch.float16),
    "to(device='cuda:0', dtype=torch.bfloat16)": lambda m: m.to(device="cuda:0", dtype=torch.bfloat16),
    "float().double()": lambda m: m.float().double(),
}

LAZY = {  # lazy module, eager twin (the reference for device and dtype), input shape
    "LazyLinear": (lambda: torch.nn.LazyLinear(4), lambda: torch.nn.Linear(3, 4), (2, 3)),
    "LazyConv2d": (lambda: torch.nn.LazyConv2d(4, 3), lambda: torch.nn.Conv2d(2, 4, 3), (1, 2, 6, 6)),
    "LazyBatchNorm1d": (lambda: torch.nn.LazyBatchNorm1d(), lambda: torch.nn.BatchNorm1d(3), (4, 3)),
}


def _tensors(m: torch.nn.Module) -> list[torch.Tensor]:
    return [*m.parameters(), *m.buffers()]


def _check(kind: str, move: str) -> None:
    """Move the lazy module as the program does, run it once on the device, and compare its
    weights' device and dtype with the eager twin moved the same way."""
    make_lazy, make_eager, shape = LAZY[kind]
    lazy, eager = make_lazy(), make_eager()
    assert any(isinstance(t, (UninitializedParameter, UninitializedBuffer)) for t in _tensors(lazy))
    moved = MOVES[move](lazy)
    assert moved is lazy
    ref = MOVES[move](eager)
    dtype, device = ref.weight.dtype, ref.weight.device
    assert all(t.dtype == dtype for t in _tensors(lazy) if t.is_floating_point()), \
        [(type(t).__name__, t.dtype) for t in _tensors(lazy)]
    out = lazy(torch.randn(shape, device="cuda").to(dtype))  # the forward pass initialises them
    assert not any(isinstance(t, (UninitializedParameter, UninitializedBuffer)) for t in _tensors(lazy))
    assert type(lazy).__name__ == kind[4:]  # became the eager module
    for got, want in zip(_tensors(lazy), _tensors(ref)):
        assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device), (got, want)
    assert lazy.weight.device == device and out.dtype == dtype and out.device == device


@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("kind", list(LAZY))
def test_a_lazy_module_moves_and_casts_on_the_cpu_target(kind, move):
    with torch_adapter.adapted("cpu"):
        _check(kind, move)


@pytest.mark.parametrize("policy, half", [("float16", torch.float16), ("float32", torch.float32)])
def test_half_on_a_lazy_module_follows_the_dtype_policy(policy, half):
    with forced("avx2"), torch_adapter.adapted("cpu", dtype_policy=policy):
        m = torch.nn.LazyLinear(4).cuda().half()
        assert m.weight.dtype is half and isinstance(m.weight, UninitializedParameter)
        out = m(torch.randn(2, 3, device="cuda", dtype=half))
        assert m.weight.dtype is half and out.dtype is half and m.weight.shape == (4, 3)


@pytest.mark.parametrize("move", ["to('cuda')", "cuda()", "half()", "to(torch.bfloat16)", "to('cpu')"])
@pytest.mark.parametrize("kind", ["LazyLinear", "LazyConv2d"])
def test_a_lazy_module_moves_and_casts_on_a_simulated_target(kind, move):
    with torch_adapter.adapted("mps", simulate=True):
        _check(kind, move)


def _uninitialized_moves(device: str) -> dict[str, list[str]]:
    out = {}
    for cls in (UninitializedParameter, UninitializedBuffer):
        t = cls()
        moved = (t.to(device), getattr(t, device)(), t.to(torch.bfloat16), t.to(device, dtype=torch.float64), t.half())
        out[cls.__name__] = [(type(x).__name__, x.dtype, x.device) for x in moved]
    return out


def test_an_uninitialized_parameter_itself_moves_as_on_plain_torch_and_other_functions_still_refuse_it():
    plain = _uninitialized_moves("cpu")  # what plain torch gives (a cast parameter is a plain Tensor, as there)
    with torch_adapter.adapted("cpu", dtype_policy="float16"):
        assert _uninitialized_moves("cuda") == plain
        for cls in (UninitializedParameter, UninitializedBuffer):
            with pytest.raises(ValueError, match="uninitialized parameter"):
                torch.add(cls(), 1)  # the lazy contract stands: only moves and casts pass


def test_uninstall_leaves_torchs_list_of_allowed_methods_as_it_was():
    before = list(UninitializedTensorMixin._allowed_methods)
    with torch_adapter.adapted("cpu"):
        during = UninitializedTensorMixin._allowed_methods
        assert torch.Tensor.to in during and torch.Tensor.cuda in during  # the stand-ins
        torch.nn.LazyLinear(4).to("cuda")
    after = UninitializedTensorMixin._allowed_methods
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before))
    assert torch.Tensor.to in after and torch.Tensor.cuda in after  # torch's own again
    m = torch.nn.LazyLinear(4).to("cpu").to(torch.float64)  # plain torch, as before install
    m(torch.randn(2, 3, dtype=torch.float64))
    assert m.weight.dtype is torch.float64
    # a CPU build: no CUDA, the error a plain tensor's .cuda() gets in this process ("Torch not compiled
    # with CUDA enabled"; "PyTorch is not linked with support for cuda devices" once torch's one-way C++
    # lazy-init flag for CUDA was set in the process — by an earlier test in a shared worker in CI)
    with pytest.raises((AssertionError, RuntimeError)) as plain:
        torch.ones(1).cuda()
    with pytest.raises(plain.type, match=re.escape(str(plain.value))):
        torch.nn.LazyLinear(4).cuda()
