"""The program's custom ops are routed as aten ops are (routing/program_ops.py, routing/engine.py).

Issue 34 found a custom op's fallback line without its site; the cause was that the engine ran no
custom op at all, while the report classified it: on a simulated target its "fallback" copied
nothing, and under ``fallback="error"`` the report said *refused* while the call ran. Here, on a
simulated MPS, a custom op with a CPU kernel only really falls back — copies counted, the user's line
recorded, the policy obeyed — whether defined before the session or during it; torch's own
namespaces are left alone, and uninstall leaves the op's kernels as they were.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch

import torch_adapter
from torch_adapter.errors import FallbackError
from torch_adapter.routing.program_ops import program_op

_names = itertools.count()


def _bias_gelu(namespace: str = "op_routing"):
    """A new custom op (a unique name each time), CPU kernel only, as notebook 03 defines one."""
    name = f"{namespace}::bias_gelu_{next(_names)}"

    @torch.library.custom_op(name, mutates_args=(), device_types="cpu")
    def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + bias, approximate="tanh")

    return name, bias_gelu


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(inspect.getsource(inspect.getmodule(_line)).splitlines(), 1)
                if marker in text and "_line(" not in text)


@pytest.mark.parametrize("defined", ["before", "during"])
def test_a_custom_op_the_target_lacks_falls_back_with_copies_and_its_site(defined):
    if defined == "before":
        name, op = _bias_gelu()
    torch_adapter.install(target="mps", simulate=True)
    if defined == "during":  # registered through the session's Library.impl
        name, op = _bias_gelu()
    x, bias = torch.randn(64, 32).cuda(), torch.randn(32).cuda()
    with torch_adapter.trace() as log:
        y = op(x, bias)  # OP-CALL
    torch.testing.assert_close(y, torch.nn.functional.gelu(x + bias, approximate="tanh"))
    (rec,) = [r for r in log.table() if r["op"] == name]
    assert rec["route"] == "fallback" and rec["calls"] == 1 and rec["via"] == "cpu"
    assert rec["bytes_copied"] == x.nbytes + bias.nbytes + y.nbytes  # in, and the result back
    assert (rec["site"]["file"], rec["site"]["line"]) == (__file__, _line("# OP-CALL"))


def test_the_strict_policy_refuses_a_custom_op():
    """It used to run, while the cell's report counted it refused ("so the call raises FallbackError")."""
    name, op = _bias_gelu()
    torch_adapter.install(target="mps", simulate=True, fallback="error")
    x, bias = torch.randn(4, 2).cuda(), torch.randn(2).cuda()
    with torch_adapter.trace() as log, pytest.raises(FallbackError, match=f"{name} on mps") as caught:
        op(x, bias)
    assert "register_fallback" in str(caught.value)
    assert [(r["op"], r["route"]) for r in log.table() if r["op"] == name] == [(name, "refused")]
    torch_adapter.configure(fallback="allow")
    assert op(x, bias).shape == x.shape


def test_a_kernel_registered_later_runs_and_stays_routed():
    """A second ``Library.impl`` at the CPU key goes on top of the engine's override; the override goes
    back on top of it, and calls it as the op's CPU kernel from then on."""
    lib = torch.library.Library(f"op_routing_lib{next(_names)}", "DEF")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 2, "CPU")
    name, op = f"{lib.ns}::scale", getattr(torch.ops, lib.ns).scale
    torch_adapter.install(target="mps", simulate=True)
    later = torch.library.Library(lib.ns, "IMPL")
    later.impl("scale", lambda x: x * 3, "CPU")  # (torch warns that it overrides the first: it does)
    x = torch.ones(4).cuda()
    with torch_adapter.trace() as log:
        y = op(x)
    assert torch.equal(y, x * 3)  # the new kernel ran ...
    (rec,) = [r for r in log.table() if r["op"] == name]
    assert rec["route"] == "fallback" and rec["bytes_copied"] == 2 * x.nbytes  # ... as the target's fallback
    torch_adapter.uninstall()
    assert torch.equal(op(torch.ones(4)), torch.full((4,), 3.0))  # and stays the op's kernel after


def test_an_op_registered_for_the_target_is_native_there():
    name, op = _bias_gelu()
    torch_adapter.install(target="mps", simulate=True)
    x, bias = torch.randn(4, 2).cuda(), torch.randn(2).cuda()
    torch_adapter.register_accelerated(name, lambda x, bias: x * 0 + 1, device="mps")
    with torch_adapter.trace() as log:
        y = op(x, bias)
    assert torch.equal(y, torch.ones_like(x))
    assert [r["route"] for r in log.table() if r["op"] == name] == ["native"]


def test_uninstall_leaves_the_ops_kernels_as_they_were():
    name, op = _bias_gelu()
    before = torch._C._dispatch_dump(name)
    torch_adapter.install(target="mps", simulate=True)
    assert name in torch_adapter.current().routing.overrides
    assert torch._C._dispatch_dump(name) != before
    torch_adapter.uninstall()
    assert torch._C._dispatch_dump(name) == before


def test_a_cuda_only_custom_op_keeps_the_kernel_the_session_serves():
    """redirect/custom_ops.py gives an op with only a CUDA kernel one at the target's key: the engine
    does not override that op (its CUDA kernel is what runs, as before)."""
    name = f"op_routing::cuda_only_{next(_names)}"

    @torch.library.custom_op(name, mutates_args=(), device_types="cuda")
    def cuda_only(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch_adapter.install(target="mps", simulate=True)
    assert name not in torch_adapter.current().routing.overrides
    x = torch.ones(3).cuda()
    assert torch.equal(cuda_only(x), x * 2)


def test_the_programs_ops_are_told_from_torchs_own():
    name, _ = _bias_gelu()
    assert program_op(name)  # a custom_op defined here, outside torch
    lib = torch.library.Library(f"op_routing_def{next(_names)}", "DEF")
    exec("lib.define('scale(Tensor x) -> Tensor')", {"lib": lib})  # code without a file (a notebook cell)
    assert program_op(f"{lib.ns}::scale")
    for torchs in ("aten::add.Tensor", "prims::add", "quantized::add_relu_out", "c10d::monitored_barrier_",
                   "profiler::_record_function_enter_new"):
        assert not program_op(torchs), torchs
    # torch's own torch.library.custom_op (defined at `import torch`): the dispatcher names torch's
    # custom_ops.py as the definer of every custom_op, the program's too; its function's module tells
    assert "debug_mode_ops::annotate" in torch._C._dispatch_get_all_op_names()
    assert not program_op("debug_mode_ops::annotate")
