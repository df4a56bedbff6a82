"""float16 at the CPU's speed (routing/low_precision.py), the CPU's capability as data
(core/cpu_features.py) and ``torch-adapter run --optimize``.

Each CPU kind is forced (``cpu_features.forced`` / ``TORCH_ADAPTER_CPU_FEATURES``), so every
policy runs on whatever machine CI lands on: the decision is asserted, and the numerics, which
are real whatever the kind (bfloat16 and float32 kernels run everywhere; only their speed differs).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_adapter
from conftest import run_cli
from torch_adapter.core import torch_private as tp
from torch_adapter.core.cpu_features import cpu_features, forced

# float16 tensors as the program asked on every kind: these tests are about the float16 rewrite, which
# also serves where the dtype policy maps float16 requests to float32 (tests/test_dtype_policy.py)
FLOAT16_TENSORS = {"dtype_policy": "float16"}

# CUDA AMP's tolerance for a float16 model against its float32 reference; bfloat16 (8 significant
# bits) rounds each product input to ~4e-3: a few roundings per output.
AMP_TOL = dict(rtol=3e-2, atol=3e-2)
KIND_DECISION = {"avx2": torch.float32, "avx512_bf16": torch.bfloat16, "avx512_fp16": torch.bfloat16,
                 "amx_fp16": None}


class _Block(torch.nn.Module):
    """Conv -> attention -> Linear: each heavy op family once."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # (N, 16, H, W)
        seq = h.flatten(2).transpose(1, 2).contiguous()  # (N, HW, 16); rows contiguous: the flash kernel
        q = seq.unflatten(-1, (2, 8)).transpose(1, 2)  # 2 heads of 8
        a = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).flatten(2)
        return self.proj(a)


def _model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return _Block(), torch.randn(2, 8, 6, 6)


def _reference() -> torch.Tensor:
    """The float16-rounded weights and input, computed in float32."""
    model, x = _model_and_input()
    with torch.no_grad():
        return model.half().float()(x.half().float())


def _cuda_program(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    model = model.cuda().half()
    with torch.no_grad():
        return model(x.cuda().half())


def _has_our_kernel(op: str = "aten::mm") -> bool:
    return tp.python_kernel(op, "CPU") is not None or "_half_gate.cpp" in repr(torch.library.get_kernel(op, "CPU"))


@pytest.mark.parametrize("kind", list(KIND_DECISION))
def test_each_cpu_kind_gets_its_decision_and_amp_numerics(kind):
    with forced(kind):
        with torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as session:
            rewrite = session.low_precision
            assert rewrite.dtype == KIND_DECISION[kind]
            assert _has_our_kernel() == (KIND_DECISION[kind] is not None)
            y = _cuda_program(*_model_and_input())
    assert y.dtype == torch.float16  # the program's dtype, whatever the CPU computed in
    torch.testing.assert_close(y.float(), _reference(), **AMP_TOL)
    assert not _has_our_kernel()  # uninstalled: plain torch


def test_the_kind_comes_from_the_environment_and_shows_in_targets():
    done = run_cli("targets", "--json", env={"TORCH_ADAPTER_CPU_FEATURES": "avx2"})
    assert done.returncode == 0, done.stderr
    cpu = next(r for r in json.loads(done.stdout) if r["name"] == "cpu")["details"]
    assert cpu["cpu_kind"] == "avx2" and cpu["float16_compute"] == "float32" and cpu["bf16_units"] == "none"
    assert cpu["features_from"] == "TORCH_ADAPTER_CPU_FEATURES=avx2"
    with forced("avx512_bf16"):
        details = torch_adapter.describe("cpu")["details"]
    assert details["cpu_kind"] == "avx512_bf16" and details["float16_compute"] == "bfloat16"
    assert details["float16_attention"] == "float32"  # no AMX tiles
    assert cpu["float16_attention"] == "float32"
    with forced("amx"):
        assert torch_adapter.describe("cpu")["details"]["float16_attention"] == "bfloat16"


def test_the_optimization_levels_read_the_same_capability():
    from torch_adapter.optimization.layer import native_low_precision

    with forced("avx2"):
        assert native_low_precision("cpu") is None
        with torch_adapter.adapted("cpu", **FLOAT16_TENSORS, optimization_level="balanced") as s:
            assert s.optimizer_layer.plan["autocast"] is None  # bf16 is emulated there: no autocast
    with forced("avx512_bf16"):
        assert native_low_precision("cpu") is torch.bfloat16
        with torch_adapter.adapted("cpu", **FLOAT16_TENSORS, optimization_level="balanced") as s:
            assert s.optimizer_layer.plan["autocast"] == "bfloat16"


def test_rewritten_calls_show_in_the_routing_report_with_their_reason():
    model, x = _model_and_input()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as session:
        model, x = model.cuda().half(), x.cuda().half()
        with torch_adapter.trace(use_observer=False) as log, torch.no_grad():
            model(x)
        f32 = torch.randn(4, 4)
        with torch_adapter.trace(use_observer=False) as log32:
            f32 @ f32
        redirects = [e for e in session.redirect_log.entries() if e.kind == "low_precision"]
    rows = {r.op: r for r in log.records() if r.via == "low_precision"}
    assert {"aten::convolution", "aten::_scaled_dot_product_flash_attention_for_cpu"} <= set(rows)
    assert rows.keys() & {"aten::addmm", "aten::mm", "aten::bmm"}
    for op, rec in rows.items():
        assert rec.route == "composite" and rec.calls >= 1
        if op == "aten::_scaled_dot_product_flash_attention_for_cpu":  # no AMX tiles: attention in float32
            assert rec.reason.startswith("float16 computed in float32 (this CPU has bf16 units (avx512_bf16) but "
                                         "no AMX-BF16 tiles, where torch's CPU flash attention is slower"), rec.reason
            continue
        assert rec.reason.startswith("float16 computed in bfloat16 (this CPU has bf16 units (avx512_bf16) and no "
                                     "fp16 units"), rec.reason
    assert not any(r.via == "low_precision" for r in log32.records())  # float32 calls are not rewritten
    assert redirects and all("float16 computed in" in e.became for e in redirects)


@pytest.mark.parametrize("gate", ["cpp", "python"])
@pytest.mark.parametrize("kind, expected", [("avx512_bf16", torch.float32), ("amx", torch.bfloat16),
                                            ("avx2", torch.float32)])
def test_attention_computes_in_the_dtype_the_kind_runs_it_fastest_in(gate, kind, expected, monkeypatch):
    """float16 attention: bfloat16 only where AMX tiles run torch's bfloat16 flash attention; without
    them (avx512_bf16: its bfloat16 products are fast, its bfloat16 attention is not) float32. The
    output is bit for bit the kernel's in that dtype, and the report says which and why."""
    _backend(gate, monkeypatch)
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 48, 16).half() for _ in range(3))
    mask = torch.randn(48, 48).half()
    with forced(kind), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as session:
        assert (session.low_precision.gate is not None) == (gate == "cpp")
        with torch_adapter.trace(use_observer=False) as log:
            out = F.scaled_dot_product_attention(q, k, v)
            masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    (row,) = [r for r in log.records() if r.op == "aten::_scaled_dot_product_flash_attention_for_cpu"]
    assert row.via == "low_precision" and row.calls == 2
    assert row.reason.startswith(f"float16 computed in {str(expected)[6:]} ("), row.reason
    assert out.dtype == masked.dtype == torch.float16

    def computed(dtype: torch.dtype, **kw: torch.Tensor) -> torch.Tensor:
        args = [t.float().to(dtype) for t in (q, k, v)]
        return F.scaled_dot_product_attention(*args, **{n: t.float().to(dtype) for n, t in kw.items()}).float().half()

    torch.testing.assert_close(out, computed(expected), rtol=0, atol=0)
    torch.testing.assert_close(masked, computed(expected, attn_mask=mask), rtol=0, atol=0)


@pytest.mark.parametrize("gate", ["cpp", "python"])
@pytest.mark.parametrize("kind, few, many", [("avx512_bf16", torch.float32, torch.bfloat16),
                                             ("amx", torch.bfloat16, torch.bfloat16),
                                             ("avx2", torch.float32, torch.float32)])
def test_attention_backward_computes_in_bfloat16_over_many_keys_where_the_forward_is_float32(
        gate, kind, few, many, monkeypatch):
    """Without AMX tiles the bfloat16 attention backward pays off only over 512 key tokens or more
    (bench_attention_dtype.py): fewer keys compute in float32; with AMX, bfloat16 throughout."""
    _backend(gate, monkeypatch)
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    torch.manual_seed(4)

    def inputs(keys: int) -> tuple:
        q, k, v = torch.randn(1, 1, 8, 8).half(), torch.randn(1, 1, keys, 8).half(), torch.randn(1, 1, keys, 8).half()
        out, lse = fwd(q.float(), k.float(), v.float())  # (before install: the CPU's own kernel)
        return torch.randn(1, 1, 8, 8).half(), q, k, v, out.half(), lse

    cases = {64: (inputs(64), few), 512: (inputs(512), many)}
    with forced(kind), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        with torch_adapter.trace(use_observer=False) as log:
            got = {keys: bwd(*args, 0.0, False) for keys, (args, _) in cases.items()}
    (row,) = [r for r in log.records() if r.op == "aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert row.via == "low_precision" and row.calls == 2
    assert ("with under 512 key tokens in float32" in row.reason) == (kind == "avx512_bf16"), row.reason
    for keys, (args, dtype) in cases.items():
        grads = bwd(*(a.float().to(dtype) if a.dtype is torch.float16 else a for a in args), 0.0, False)
        for g, want in zip(got[keys], grads):
            assert g.dtype == torch.float16
            torch.testing.assert_close(g, want.float().half(), rtol=0, atol=0, msg=f"{keys} keys, {dtype}")


def test_configure_recaptures_the_gate_when_attention_changes_dtype():
    """An explicit ``float16_compute="bfloat16"`` computes attention in bfloat16 too; ``auto`` puts the
    kind's choice back (the C++ gate captured the float32 set: it is captured again)."""
    q = torch.randn(1, 2, 32, 16).half()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as session:
        rewrite = session.low_precision
        name = "aten::_scaled_dot_product_flash_attention_for_cpu"
        assert name in rewrite.fp32_ops
        auto = F.scaled_dot_product_attention(q, q, q)
        torch_adapter.configure(float16_compute="bfloat16")
        assert name not in rewrite.fp32_ops and "aten::_softmax" in rewrite.fp32_ops
        assert rewrite.gate is None or rewrite.gate_fp32 == rewrite.fp32_ops
        bf16 = F.scaled_dot_product_attention(q, q, q)
        torch_adapter.configure(float16_compute="auto")
        assert name in rewrite.fp32_ops and (rewrite.gate is None or rewrite.gate_fp32 == rewrite.fp32_ops)
        again = F.scaled_dot_product_attention(q, q, q)
    b = q.float().bfloat16()
    torch.testing.assert_close(bf16, F.scaled_dot_product_attention(b, b, b).float().half(), rtol=0, atol=0)
    torch.testing.assert_close(auto, again, rtol=0, atol=0)
    assert not torch.equal(auto, bf16)


def test_a_large_product_is_computed_in_bfloat16_a_tiny_one_in_float32():
    a, b = torch.randn(256, 256).half(), torch.randn(256, 256).half()
    small = torch.randn(2, 8).half()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        with torch_adapter.trace(use_observer=False) as log:
            big = a @ b
            tiny = small @ small.t()
    (mm,) = [r for r in log.records() if r.via == "low_precision"]
    assert mm.calls == 2 and mm.reason.startswith("float16 computed in bfloat16")
    assert mm.reason.endswith("; products under 1,048,576 multiply-adds in float32)"), mm.reason
    assert big.dtype == tiny.dtype == torch.float16
    torch.testing.assert_close(big.float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)  # |entries| ~ 16
    torch.testing.assert_close(tiny.float(), small.float() @ small.float().t(), rtol=1e-3, atol=1e-3)


def test_the_off_switch_leaves_float16_as_the_cpu_computes_it():
    model, x = _model_and_input()
    with torch.no_grad():
        plain = model.half()(x.half())
    model, x = _model_and_input()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS, float16_compute="float16") as session:
        assert session.low_precision.dtype is None and not _has_our_kernel()
        y = _cuda_program(model, x)
        torch_adapter.configure(float16_compute="auto")  # and on again, at once
        assert session.low_precision.dtype is torch.bfloat16 and _has_our_kernel()
        torch_adapter.configure(float16_compute="float16")
        assert not _has_our_kernel()
    torch.testing.assert_close(y, plain, rtol=0, atol=0)


def test_float32_bfloat16_and_integer_calls_go_to_the_cpu_kernel_unchanged():
    torch.manual_seed(1)
    a32, w = torch.randn(16, 32), torch.randn(8, 4, 3, 3)
    a16, x = a32.bfloat16(), torch.randn(1, 4, 5, 5)
    before = (a32 @ a32.t(), a16 @ a16.t(), F.conv2d(x, w))
    with forced("avx2"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        assert _has_our_kernel()
        during = (a32 @ a32.t(), a16 @ a16.t(), F.conv2d(x, w))
    for b, d in zip(before, during):
        assert b.dtype == d.dtype
        torch.testing.assert_close(b, d, rtol=0, atol=0)


def test_training_in_float16_gives_float16_grads_close_to_float32():
    model, x = _model_and_input()
    ref_model, _ = _model_and_input()
    ref_model = ref_model.half().float()
    ref_model(x.half().float()).square().mean().backward()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        model = model.cuda().half()
        xin = x.cuda().half().requires_grad_()
        with torch_adapter.trace(use_observer=False) as log:
            model(xin).float().square().mean().backward()
    backward = {r.op for r in log.records() if r.via == "low_precision"}
    assert {"aten::convolution_backward", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"} <= backward
    for p, ref in zip(model.parameters(), ref_model.parameters()):
        assert p.dtype == p.grad.dtype == torch.float16
        torch.testing.assert_close(p.grad.float(), ref.grad, rtol=5e-2, atol=2e-3)


@pytest.mark.parametrize("gate", ["cpp", "python"])
def test_a_parameter_is_cast_once_until_it_changes(gate, monkeypatch):
    _backend(gate, monkeypatch)
    lin = torch.nn.Linear(64, 64).half()
    x = torch.randn(64, 64).half()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as session, torch.no_grad():
        rewrite = session.low_precision
        assert (rewrite.gate is not None) == (gate == "cpp")
        lin(x)
        cached = rewrite.cache_info()["params"]
        first = lin(x)
        assert rewrite.cache_info()["params"] == cached > 0
        lin.weight.mul_(2)  # an in-place change (an optimizer step): a new copy, the old one dropped
        second = lin(x)
        assert rewrite.cache_info()["params"] == cached
        del lin.weight  # a parameter that dies is no longer kept (its copies go at the next new parameter)
        torch.nn.Linear(64, 64).half()(x)  # (and this one's two die with it)
        assert rewrite.cache_info()["params"] == cached - 1
    torch.testing.assert_close(second.float() - lin.bias.float(), 2 * (first.float() - lin.bias.float()),
                               rtol=2e-2, atol=5e-2)
    assert rewrite.cache_info()["params"] == 0  # uninstalled: the copies are gone


def _backend(gate: str, monkeypatch) -> None:
    """``cpp``: the C++ gate does the rewrite (skipped where it cannot be built); ``python``: the Python kernels."""
    from torch_adapter.routing import half_gate

    if gate == "cpp":
        if not (half_gate.is_built() or tp.can_build_extensions()):
            pytest.skip("no C++ compiler or ninja: the Python kernels serve")
        half_gate.build()
    monkeypatch.setenv(half_gate.ENV, "" if gate == "cpp" else "python")
    monkeypatch.setattr(half_gate, "_EXT", None)


def test_saved_weights_stay_float16(tmp_path):
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        model = _Block().cuda().half()
        torch.save(model.state_dict(), tmp_path / "w.pt")
    assert {v.dtype for v in torch.load(tmp_path / "w.pt").values()} == {torch.float16}


def test_a_bad_policy_is_a_usage_error():
    from torch_adapter.errors import UsageError

    with pytest.raises(UsageError, match="float16_compute"):
        torch_adapter.install("cpu", float16_compute="fp8")


def test_run_optimize_end_to_end_reaches_the_script_and_its_children(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import subprocess, sys, torch, torch_adapter\n"
        "s = torch_adapter.current()\n"
        "print('parent', s.config.optimization_level, s.config.float16_compute)\n"
        "child = 'import torch_adapter; c = torch_adapter.current().config; print(\"child\", c.optimization_level)'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
        "m = torch.nn.Linear(4, 4).cuda(); m(torch.randn(2, 4, device='cuda'))\n"
        "from torch_adapter.optimization.layer import applied\n"
        "print('applied', sorted({a['what'] for a in applied()}))\n")
    done = run_cli("run", "--optimize", "balanced", "--float16-compute", "float32", str(script),
                   env={"TORCH_ADAPTER_CPU_FEATURES": "avx512_bf16"})
    assert done.returncode == 0, done.stderr
    assert "parent balanced float32" in done.stdout and "child balanced" in done.stdout, done.stdout
    assert "applied ['autocast']" in done.stdout, done.stdout


@pytest.mark.parametrize("flag, value", [("--optimize", "fast"), ("--float16-compute", "fp8")])
def test_run_with_an_unknown_value_exits_2_listing_the_allowed_ones(tmp_path, flag, value):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    done = run_cli("run", flag, value, str(script))
    assert done.returncode == 2 and "ran" not in done.stdout
    allowed = "'conservative', 'balanced', 'aggressive'" if flag == "--optimize" else "'auto', 'bfloat16'"
    assert f"invalid choice: '{value}'" in done.stderr and allowed in done.stderr, done.stderr


def test_the_detected_features_are_read_once():
    assert cpu_features() is cpu_features()
    assert cpu_features().source in ("/proc/cpuinfo", "sysctl", "none") or "TORCH_ADAPTER_CPU_FEATURES" in \
        cpu_features().source
    assert sys.platform != "linux" or cpu_features().source != "none"


def test_the_default_trace_counts_a_rewritten_call_once():
    """With the C++ observer (where it builds) the call is counted by the observer and by the
    kernel: trace() keeps the kernel's composite row and takes it off the observer's native count."""
    a = torch.randn(256, 256).half()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        with torch_adapter.trace() as log:
            a @ a
            a @ a
    rows = [r for r in log.records() if r.op == "aten::mm"]
    assert [(r.route, r.calls) for r in rows] == [("composite", 2)], (log.meta, rows)


# --- float32-computed ops (FP32_OPS): group_norm (+ backward) and softmax ------------------------

def _norm_program(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return F.group_norm(x, 4, w, b), x.softmax(-1)


def _norm_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(2)
    return torch.randn(2, 8, 5, 5).half() * 3 + 1, torch.randn(8).half(), torch.randn(8).half()


@pytest.mark.parametrize("kind", list(KIND_DECISION))
def test_group_norm_and_softmax_compute_in_float32_with_float16_in_and_out(kind):
    x, w, b = _norm_inputs()
    ref = [r.half() for r in _norm_program(x.float(), w.float(), b.float())]  # float32 math, rounded once
    xg = x.clone().requires_grad_()
    with forced(kind), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        with torch_adapter.trace(use_observer=False) as log:
            out = _norm_program(xg, w, b)
            out[0].float().square().sum().backward()
    rows = {r.op: r for r in log.records() if r.via == "low_precision"}
    if KIND_DECISION[kind] is None:  # a CPU with float16 tiles: float16 as the CPU computes it
        assert not rows
        return
    assert set(rows) == {"aten::native_group_norm", "aten::native_group_norm_backward", "aten::_softmax"}
    for rec in rows.values():
        assert rec.route == "composite"
        assert rec.reason.startswith("float16 computed in float32 (its float16 CPU kernel is slower than float32"), \
            rec.reason
    assert [o.dtype for o in out] == [torch.float16] * 2 and xg.grad.dtype == torch.float16
    for o, r in zip(out, ref):  # float32 internally: at most one float16 rounding off the float32 answer
        torch.testing.assert_close(o, r, rtol=1e-3, atol=1e-3)
    xf = x.float().requires_grad_()
    F.group_norm(xf, 4, w.float(), b.float()).square().sum().backward()
    torch.testing.assert_close(xg.grad.float(), xf.grad, rtol=2e-2, atol=2e-2)


def test_the_off_switch_leaves_the_norms_as_the_cpu_computes_them():
    x, w, b = _norm_inputs()
    plain = _norm_program(x, w, b)
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS, float16_compute="float16"):
        assert tp.python_kernel("aten::native_group_norm", "CPU") is None
        with torch_adapter.trace(use_observer=False) as log:
            off = _norm_program(x, w, b)
    assert not any(r.via == "low_precision" for r in log.records())
    for p, o in zip(plain, off):
        torch.testing.assert_close(o, p, rtol=0, atol=0)


def test_softmax_asking_for_a_float32_output_is_the_cpus_answer():
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        with pytest.raises(RuntimeError, match="half to float conversion is not supported on CPU"):
            torch._softmax(torch.randn(3, 3).half(), -1, True)


# --- recent outputs in the compute dtype (routing/lowp_cache.py) ---------------------------------

def _chain(x: torch.Tensor, a: torch.nn.Linear, b: torch.nn.Linear, inplace: bool) -> torch.Tensor:
    h = a(x).view(4, 32, 128)  # a view of our output (attention's q/k/v are views of Linear outputs)
    if inplace:
        h[0].mul_(-2)  # changed in place through a view: the kept copy is stale
    return b(h)


@pytest.mark.parametrize("gate", ["cpp", "python"])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_chain_of_rewritten_ops_casts_once_and_gives_the_recast_answer(inplace, gate, monkeypatch):
    _backend(gate, monkeypatch)
    torch.manual_seed(3)
    x = torch.randn(128, 256).half()
    a, b = torch.nn.Linear(256, 128).half(), torch.nn.Linear(128, 128).half()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as session, torch.no_grad():
        rewrite = session.low_precision
        rewrite.set_output_cache_size(16)
        kept = _chain(x, a, b, inplace)
        hits = rewrite.cache_info()["hits"]
        rewrite.set_output_cache_size(0)  # nothing kept: every input cast from float16 again
        recast = _chain(x, a, b, inplace)
        assert rewrite.cache_info()["hits"] == 0
    assert hits == (0 if inplace else 1)
    # bfloat16 values are float16 values (in float16's range): the kept copy is the recast one, bit for bit
    torch.testing.assert_close(kept, recast, rtol=0, atol=0)
    assert rewrite.cache_info()["outputs"] == 0  # uninstalled: nothing kept


@pytest.mark.parametrize("kind", ["avx2", "avx512_bf16"])
def test_inference_mode_tensors_are_rewritten_without_a_version_counter(kind):
    # timm's validation: autocast("cuda", float16) under torch.inference_mode(); inference tensors have
    # no _version, so neither cache may keep them (the run once raised "Inference tensors do not track
    # version counter")
    torch.manual_seed(0)
    conv, w = torch.nn.Conv2d(3, 8, 3), torch.randn(8, 8, 3, 3)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = F.conv2d(conv(x).half().float(), w.half().float())
    with forced(kind), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        c, wc = conv.cuda(), w.cuda()
        with torch.inference_mode():
            w16 = wc.half()  # an inference tensor as a weight too
            with torch.autocast("cuda", dtype=torch.float16):
                y = c(x.cuda())
            out = F.conv2d(y, w16)
            again = F.conv2d(y, w16)
    assert out.dtype is torch.float16 and out.is_inference()
    torch.testing.assert_close(out.float(), ref, **AMP_TOL)
    assert torch.equal(out, again)


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind


@pytest.mark.parametrize("kind,param", [("avx512", torch.float32), ("avx2", torch.float32),
                                        ("avx512_bf16", torch.float16)])
def test_fsdp_float16_mixed_precision_follows_the_dtype_policy_like_its_inputs(tmp_path, kind, param):
    """FSDP1 ``MixedPrecision(param_dtype=float16)`` under ``autocast("cuda", float16)`` (Lightning's
    fsdp "16-mixed"): where the dtype policy makes float16 requests float32 (a CPU computing float16 in
    float32), FSDP's input cast (``x.to(float16)``) gave float32 and autocast ran disabled, while its
    unsharded parameters (factories on the CPU compute device) stayed float16: the conv raised "Input
    type (float) and bias type (c10::Half) should be the same". Its parameters follow the policy now, as
    on CUDA everything is float16 and the conv runs; where float16 stays float16 nothing changes."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision

    with forced(kind), torch_adapter.adapted("cpu"):
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
        try:
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                      torch.nn.Linear(4 * 6 * 6, 3)).cuda()
            ref = torch.nn.Sequential(*[m for m in net]).float()
            x = torch.randn(8, 1, 8, 8, device="cuda")
            expected = ref(x).detach()
            mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16)
            model = FSDP(net, device_id=torch.cuda.current_device(), mixed_precision=mp)
            seen = []
            model.module[0].register_forward_pre_hook(lambda m, a: seen.append((a[0].dtype, m.weight.dtype,
                                                                                 m.bias.dtype)))
            for grad in (False, True):
                with torch.set_grad_enabled(grad), torch.autocast("cuda", dtype=torch.float16):
                    y = model(x)
                if grad:
                    y.float().sum().backward()
                assert torch.allclose(y.float(), expected, atol=2e-2, rtol=2e-2), kind
            assert set(seen) == {(param, param, param)}, seen
        finally:
            dist.destroy_process_group()
