"""The C++ float16 gate (routing/half_gate.py): float32 calls of the heavy ops never enter Python,
float16 ones get the same answers as from the Python kernels alone, and the build runs once, in the
background, where it is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_adapter
from torch_adapter.core import cpp_build
from torch_adapter.core import torch_private as tp
from torch_adapter.core.cpu_features import forced
from torch_adapter.routing import half_gate, low_precision
from torch_adapter.session import suspended

# float16 tensors as the program asked on every kind: these tests are about the float16 rewrite, which
# also serves where the dtype policy maps float16 requests to float32 (tests/test_dtype_policy.py)
FLOAT16_TENSORS = {"dtype_policy": "float16"}

pytestmark = pytest.mark.skipif(not (half_gate.is_built() or tp.can_build_extensions()),
                                reason="no C++ compiler or ninja here: the Python kernels serve (tests/test_lowp.py)")


@pytest.fixture(scope="module")
def gate():
    half_gate.build()
    return half_gate.load()


@pytest.fixture
def backend(request, monkeypatch, gate):
    """``cpp``: the gate above the Python kernels; ``python``: the Python kernels alone."""
    monkeypatch.setenv(half_gate.ENV, "" if request.param == "cpp" else "python")
    monkeypatch.setattr(half_gate, "_EXT", None)
    return request.param


def _python_calls(fn, name: str = "kernel") -> int:
    """How many times low_precision's function ``name`` ran during ``fn()`` (a profile hook, no stand-in)."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_name == name and frame.f_code.co_filename == low_precision.__file__:
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def _cpu_kernel_text(op: str) -> str:
    return repr(torch.library.get_kernel(op, "CPU"))


def test_the_build_folder_is_torchs_own(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    for value in (None, str(tmp_path)):
        if value is None:
            monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", value)
        ours = tp.extension_build_dir("torch_adapter_probe_name")
        assert str(ours) == cpp_extension._get_build_directory("torch_adapter_probe_name", False)


@pytest.mark.parametrize("backend", ["cpp", "python"], indirect=True)
def test_with_the_gate_no_call_enters_python_but_those_a_log_must_record(backend):
    a, x, w = torch.randn(16, 16), torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    fp32_calls = lambda: (a @ a, F.conv2d(x, w), torch.softmax(a, -1), torch.addmm(a, a, a))  # noqa: E731
    fp16_calls = lambda: (a.half() @ a.half(), F.conv2d(x.half(), w.half()))  # noqa: E731
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as s:
        assert s.low_precision.gate_state == ("cpp" if backend == "cpp" else "off")
        assert ("_half_gate.cpp" in _cpu_kernel_text("aten::mm")) == (backend == "cpp")
        fp32 = _python_calls(fp32_calls)
        first = _python_calls(fp16_calls, "_note")  # each op's first rewrite: one redirect-log row
        again = _python_calls(fp16_calls, "_note"), _python_calls(fp16_calls)
        with torch_adapter.trace() as log:  # while a trace is open every rewritten call is logged
            traced = _python_calls(fp16_calls, "_note")
        after = _python_calls(fp16_calls, "_note")
        redirects = [e.asked for e in s.redirect_log.entries() if e.kind == "low_precision"]
    assert fp32 == (0 if backend == "cpp" else 4)
    assert first == 2 and traced == 2
    assert again == ((0, 0) if backend == "cpp" else (2, 2)) and after == again[0]
    assert sorted(redirects) == ["aten::convolution(float16)", "aten::mm(float16)"]
    assert {(r.op, r.route, r.calls) for r in log.records() if r.via == "low_precision"} == {
        ("aten::mm", "composite", 1), ("aten::convolution", "composite", 1)}


def _program(kind: str):
    """Each gated op family in float16 (forward and backward), and the calls the gate must leave alone."""
    torch.manual_seed(0)
    conv, lin = torch.nn.Conv2d(4, 8, 3, padding=1).half(), torch.nn.Linear(8, 8).half()
    x = torch.randn(2, 4, 6, 6, dtype=torch.half, requires_grad=True)
    out = {}
    with forced(kind), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        h = F.group_norm(conv(x), 4)
        seq = h.flatten(2).transpose(1, 2).contiguous().unflatten(-1, (2, 4)).transpose(1, 2)
        a = F.scaled_dot_product_attention(seq, seq, seq).transpose(1, 2).flatten(2)
        y = torch.softmax(lin(a), -1)
        y.float().sum().backward()
        out["y"], out["dx"], out["dw"] = y, x.grad, conv.weight.grad
        out["bmm"] = torch.baddbmm(a, a, lin.weight.detach().expand(2, 8, 8))
        out["mixed"] = torch.mm(torch.randn(3, 3), torch.randn(3, 3))  # float32: the CPU's own kernel
        with pytest.raises(RuntimeError) as mixed:  # float16 x float32: the CPU's own error, as without us
            torch.mm(torch.randn(3, 3).half(), torch.randn(3, 3))
        out["error"] = type(mixed.value), str(mixed.value)
        out["half_to_float"] = pytest.raises(RuntimeError, torch._softmax, torch.randn(2, 2).half(), -1, True)
    return out


@pytest.mark.parametrize("kind", ["avx2", "avx512_bf16"])
def test_the_gate_changes_who_decides_not_the_answers(kind, monkeypatch, gate):
    answers = {}
    for backend in ("cpp", "python"):
        monkeypatch.setenv(half_gate.ENV, "" if backend == "cpp" else "python")
        monkeypatch.setattr(half_gate, "_EXT", None)
        answers[backend] = _program(kind)
    cpp, py = answers["cpp"], answers["python"]
    for name in ("y", "dx", "dw", "bmm"):
        assert cpp[name].dtype is torch.float16
        torch.testing.assert_close(cpp[name], py[name], rtol=0, atol=0)
    torch.manual_seed(0)
    assert cpp["error"] == py["error"]
    assert str(cpp["half_to_float"].value) == str(py["half_to_float"].value)


def test_the_cpu_kernels_are_torchs_own_again_after_the_session(gate):
    before = {op: _cpu_kernel_text(op) for op in low_precision.OPS if tp.host_kernel(op, "CPU") is not None}
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS) as s:
        assert s.low_precision.gate is not None
        with suspended():
            assert {op: _cpu_kernel_text(op) for op in before} == before
        assert "_half_gate.cpp" in _cpu_kernel_text("aten::convolution")
        torch_adapter.configure(float16_compute="float16")  # the off switch takes gate and kernels off
        assert {op: _cpu_kernel_text(op) for op in before} == before
        torch_adapter.configure(float16_compute="auto")
        assert "_half_gate.cpp" in _cpu_kernel_text("aten::convolution")
    assert {op: _cpu_kernel_text(op) for op in before} == before
    assert not gate.installed()


def test_float32_calls_take_torchs_own_kernels_unboxed_and_another_kernel_is_kept(gate):
    """The typed fast paths: a float32 call of mm/addmm/bmm/baddbmm/_softmax/flash attention gives
    plain torch's bits; an override already on the CPU key when the session starts (here a counting
    kernel on aten::bmm) keeps being called for float32 calls — the fast path never bypasses it."""
    torch.manual_seed(0)
    a, b3 = torch.randn(5, 7), torch.randn(3, 5, 5)
    q = torch.randn(1, 2, 6, 8)
    calls = lambda: (torch.mm(a, a.t()), torch.addmm(a, a, torch.eye(7), beta=0.5, alpha=2.0),  # noqa: E731
                     torch.bmm(b3, b3), torch.baddbmm(b3, b3, b3, beta=2.0), torch._softmax(a, -1, False),
                     F.scaled_dot_product_attention(q, q, q, is_causal=True))
    want = calls()
    with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
        assert "_half_gate.cpp" in _cpu_kernel_text("aten::addmm")
        got = calls()
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)

    seen = []
    own = torch.library.get_kernel("aten::bmm", "CPU")
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("bmm", lambda ks, x, y: (seen.append(x.dtype), own.call_boxed(ks, x, y))[1], "CPU", with_keyset=True)
        with forced("avx512_bf16"), torch_adapter.adapted("cpu", **FLOAT16_TENSORS):
            assert "_half_gate.cpp" in _cpu_kernel_text("aten::bmm")  # the gate sits on top of the override
            torch.testing.assert_close(torch.bmm(b3, b3), want[2], rtol=0, atol=0)
            half = torch.bmm(b3.half(), b3.half())  # rewritten (a tiny product: in float32), by the override
        assert seen == [torch.float32, torch.float32] and half.dtype is torch.float16
    finally:
        lib._destroy()


def test_a_missing_gate_is_built_once_in_the_background(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_ADAPTER_PACKAGED_BUILDS", "off")  # a bare install: nothing shipped
    monkeypatch.setattr(half_gate, "_EXT", None)
    assert not half_gate.is_built()
    assert half_gate.ensure_built() == "started"
    child = half_gate.spawned()
    marker = half_gate._marker()
    assert marker.exists()
    assert half_gate.ensure_built() == "building"  # another session meanwhile starts no second build
    assert child.wait(timeout=600) == 0, marker.with_suffix(".log").read_text()[-3000:]
    assert not marker.exists() and half_gate.is_built()
    assert half_gate.ensure_built() == "built"
    # a fresh interpreter starting a CPU session finds it and uses it
    code = ("import torch_adapter, torch\nwith torch_adapter.adapted('cpu') as s:\n"
            "    print(s.low_precision.gate_state)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "TORCH_ADAPTER_PACKAGED_BUILDS": "off"})
    assert done.stdout.split() == ["cpp"], done.stderr


def test_a_stale_marker_is_replaced_and_an_unwritable_folder_only_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("TORCH_ADAPTER_PACKAGED_BUILDS", "off")
    monkeypatch.setattr(half_gate, "_EXT", None)
    monkeypatch.setattr(cpp_build, "STALE_S", 0)  # any marker counts as a dead build's
    marker = half_gate._marker()
    marker.parent.mkdir(parents=True)
    marker.write_text("12345\n")
    os.utime(marker, (1, 1))
    assert half_gate.ensure_built() == "started"
    os.killpg(half_gate.spawned().pid, signal.SIGKILL)  # the build and its compiler
    half_gate.spawned().wait()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(blocked))
    said = half_gate.ensure_built()
    assert said.startswith("cannot write"), said
    monkeypatch.setenv(half_gate.ENV, "python")
    assert half_gate.ensure_built() == "off" and half_gate.load() is None


def _special_halves() -> torch.Tensor:
    """Every float16 bit pattern but NaNs: zeros, subnormals, the largest values, infinities."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    h = bits.view(torch.float16)
    return h[~h.isnan()]


def test_the_one_pass_casts_round_as_torchs_two_passes(gate):
    if not gate.fused_casts():
        assert gate.convert(torch.zeros(4, dtype=torch.half)) is None
        pytest.skip("this CPU has no AVX512-BF16 + F16C: the two vectorised passes serve")
    h = _special_halves()
    b = gate.convert(h)
    assert b.dtype is torch.bfloat16
    assert torch.equal(b.view(torch.int16), h.float().bfloat16().view(torch.int16))
    # bfloat16 -> float16: every bfloat16 pattern but NaNs (overflow to inf, underflow to subnormals and zero)
    bb = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    bb = bb[~bb.isnan()]
    assert torch.equal(gate.convert(bb).view(torch.int16), bb.float().half().view(torch.int16))
    assert gate.convert(torch.tensor([float("nan")], dtype=torch.half)).isnan().all()
    # strides kept (channels_last), any length (a tail under 16 lanes), and what it refuses
    x = torch.randn(2, 3, 5, 7).half().contiguous(memory_format=torch.channels_last)
    y = gate.convert(x)
    assert y.stride() == x.stride() and torch.equal(y, x.float().bfloat16())
    assert gate.convert(x[..., ::2]) is None  # not dense: the caller's two passes
    assert gate.convert(torch.randn(3)) is None  # float32: not ours
    big = torch.randn(1 << 17).half()  # split over threads
    assert torch.equal(gate.convert(big), big.float().bfloat16())


def test_the_one_pass_float32_casts_round_as_torchs_own(gate):
    if not gate.f16c_casts():
        assert gate.convert_to(torch.zeros(4, dtype=torch.half), "float32") is None
        pytest.skip("this CPU has no AVX2 + F16C: torch's own casts serve")
    h = _special_halves()
    f = gate.convert_to(h, "float32")
    assert f.dtype is torch.float32 and torch.equal(f, h.float())
    # float32 -> float16: every float16 value, the midpoints between neighbours (ties to even), values
    # just off them, beyond the largest (overflow to inf), inside the subnormals, and random ones
    mid = (f[:-1].double() + f[1:].double()) / 2
    mid = mid[mid.abs() < 65520].float()
    near = torch.cat([mid.nextafter(torch.tensor(float("inf"))), mid.nextafter(torch.tensor(float("-inf")))])
    torch.manual_seed(0)
    rand = torch.randn(1 << 16) * torch.logspace(-9, 6, 1 << 16)
    x = torch.cat([f, mid, near, rand, torch.tensor([65520.0, -65520.0, 1e30, -1e30, 6e-8, 3e-8, -2.9e-8])])
    x = x[x.isfinite() | x.isinf()]
    y = gate.convert_to(x, "float16")
    assert torch.equal(y.view(torch.int16), x.half().view(torch.int16))
    assert gate.convert_to(torch.tensor([float("nan")]), "float16").isnan().all()
    # strides kept, tails under 8 lanes, threads, and what it refuses
    c = torch.randn(2, 3, 5, 7).contiguous(memory_format=torch.channels_last)
    assert gate.convert_to(c, "float16").stride() == c.stride() and torch.equal(gate.convert_to(c, "float16"), c.half())
    big = torch.randn((1 << 17) + 3)
    assert torch.equal(gate.convert_to(big, "float16"), big.half())
    assert gate.convert_to(c[..., ::2], "float16") is None  # not dense: torch's own cast
    assert gate.convert_to(torch.randn(3).double(), "float16") is None
    with pytest.raises(RuntimeError, match="convert_to"):
        gate.convert_to(c, "bfloat16")
