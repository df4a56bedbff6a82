"""An op that decomposes above autograd (CompositeImplicitAutograd: einsum), sent to the CPU by a
profile's fallback list or ``configure(force_cpu=...)``, keeps its gradient (routing/engine.py): its
kernel at the backend key alone took the op out of autograd — torch warned "an autograd kernel was not
registered" and, under observation (``trace()``, ``run --report``), the gradient was lost (``a.grad is
None``). Found by ``torch-adapter fix`` on a held-out program."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import torch_adapter
from torch_adapter.core.torch_private import can_build_extensions

EQUATION = "bij,bjk->bik"


def _grads(device: str, observe: bool):
    g = torch.Generator().manual_seed(0)
    a0, b0 = torch.randn(2, 4, 5, generator=g), torch.randn(2, 5, 3, generator=g)
    a, b = a0.to(device).requires_grad_(), b0.to(device).requires_grad_()
    with torch_adapter.trace() if observe else contextlib.nullcontext() as log:
        y = torch.einsum(EQUATION, a, b)
        (y * y).sum().backward()
    return (a0, b0), (a.grad, b.grad), log


def _expected(a0, b0):
    a, b = a0.detach().clone().requires_grad_(), b0.detach().clone().requires_grad_()
    y = torch.einsum(EQUATION, a, b)
    (y * y).sum().backward()
    return a.grad, b.grad


TARGETS = [("cpu", {}), ("npu", {"simulate": True}),
           pytest.param("npu", {"emulate": True}, marks=pytest.mark.skipif(
               not can_build_extensions(), reason="the emulated npu is a C++ extension: no compiler here"))]


@pytest.mark.parametrize("observe", [False, True], ids=["plain", "observed"])
@pytest.mark.parametrize("target,how", TARGETS, ids=["cpu", "npu-sim", "npu-emulated"])
def test_a_forced_fallback_keeps_the_gradient(target, how, observe):
    with torch_adapter.adapted(target, **how, force_cpu=["aten::einsum"]):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*an autograd kernel was not registered.*")
            (a0, b0), got, log = _grads("cuda", observe)
    want = _expected(a0, b0)
    assert got[0] is not None and got[1] is not None, "the gradient was lost"
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)
    if observe:  # the op is reported as what it was: one CPU fallback per call
        (row,) = [r for r in log.table() if r["op"] == "aten::einsum"]
        assert row["route"] == "fallback" and row["calls"] == 1
