"""What the public-program acceptance run on the emulated npu found (benchmarks/realworld, ``--target npu
--emulate --compare-cpu``), one distilled check per defect.

Each check runs a small CUDA-written script with ``python -m torch_adapter run --target npu --emulate`` in a
fresh interpreter (the device is process-wide and renaming PrivateUse1 cannot be undone: nothing here starts it
in the pytest process); the script prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from torch_adapter.core.torch_private import can_build_extensions

pytestmark = pytest.mark.skipif(not can_build_extensions(), reason="the emulated device is a C++ extension: "
                                "this machine has no C++ compiler or ninja")


def run_on_npu(tmp_path, code: str, *flags: str, timeout: int = 300) -> dict:
    """Run ``code`` as a script under ``torch-adapter run --target npu --emulate [flags]``; its RESULT object."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    p = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--target", "npu", "--emulate", *flags,
                        str(script)],
                       capture_output=True, text=True, env=env, timeout=timeout, cwd=str(tmp_path))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"rc={p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_accelerate_puts_the_program_on_the_npu_with_its_scaler(tmp_path):
    """accelerate (1.16) picks its backend from ``torch.accelerator.current_accelerator()`` and, before that,
    looks for torch_npu: without the emulated device's torch_npu it put the program on the CPU (diffusers'
    fp16 training: no autocast, 'mat1 and mat2 must have the same dtype'). The accelerator answers a program
    ``cuda`` (a library outside torch is the program's: docs/redirect.md), so accelerate takes its CUDA path —
    the one the program was written against — with autocast and its GradScaler, and every tensor it makes
    on ``acc.device`` is on the npu. transformers, whose NPU path imports torch_npu's own kernels, keeps its
    portable path."""
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    r = run_on_npu(tmp_path, """
        import json, torch
        from accelerate import Accelerator
        acc = Accelerator(mixed_precision="fp16")
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(m.parameters(), lr=0.1)
        m, opt = acc.prepare(m, opt)
        x = torch.randn(8, 4, device=acc.device)
        before = m.weight.detach().cpu().clone()
        with acc.autocast():
            inner = torch.nn.functional.linear(x, m.weight, m.bias)
            loss = m(x).float().pow(2).mean()
        acc.backward(loss)
        opt.step()
        import torch_npu
        from transformers.utils import is_torch_npu_available
        try:
            torch_npu.npu_fusion_attention
            kernel = "present"
        except AttributeError as e:
            kernel = str(e)
        print("RESULT " + json.dumps({"device": acc.device.type, "native_amp": acc.native_amp,
              "autocast_dtype": str(inner.dtype), "scaler": type(acc.scaler).__name__,
              "stepped": not torch.equal(before, m.weight.detach().cpu()), "param": m.weight.device.type,
              "npu_module": torch_npu.npu is torch.npu, "transformers_npu": is_torch_npu_available(),
              "kernel": kernel}))
    """)
    assert r["device"] == "cuda" and r["native_amp"] is True and r["param"] == "npu"
    assert r["autocast_dtype"] == "torch.float16" and r["scaler"] == "GradScaler" and r["stepped"]
    assert r["npu_module"] is True and r["transformers_npu"] is False
    assert "emulated npu" in r["kernel"] and "npu_fusion_attention" in r["kernel"]


def test_module_to_keeps_the_parameters_an_optimizer_holds(tmp_path):
    """Module.to('cuda') on the npu made new Parameter objects (torch's shallow-copy rule knows the in-tree
    backends only; a PrivateUse1 device registers _has_compatible_shallow_copy_type): an optimizer built
    before the move held the host copies and got no gradients (GradScaler: 'No inf checks were recorded
    for this optimizer')."""
    r = run_on_npu(tmp_path, """
        import json, torch
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2)
        held = m.weight
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        m.to("cuda")
        before = m.weight.detach().cpu().clone()
        scaler = torch.amp.GradScaler("cuda")
        scaler.scale(m(torch.randn(4, 3, device="cuda")).sum()).backward()
        scaler.step(opt)
        print("RESULT " + json.dumps({"same_object": m.weight is held, "device": str(m.weight.device),
              "stepped": not torch.equal(before, m.weight.detach().cpu()),
              "compatible": torch._has_compatible_shallow_copy_type(torch.ones(1), torch.ones(1, device="cuda"))}))
    """)
    assert r == {"same_object": True, "device": "npu:0", "stepped": True, "compatible": True}


def test_lstm_runs_on_the_npu_as_on_the_host(tmp_path):
    """torch picks _thnn_fused_lstm_cell for an LSTM on a PrivateUse1 device; torch has it for CUDA only, so
    on the emulated npu it reached the CPU, which has no kernel: NotImplementedError (word_language_model,
    mnist_rnn). The device's kernel (CUDA's arithmetic) gives the host's values and gradients."""
    r = run_on_npu(tmp_path, """
        import copy, json, torch
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(8, 16, 2)
        cell = torch.nn.LSTMCell(8, 16, bias=False)
        x = torch.randn(5, 3, 8)
        out = {}
        for where in ("cpu", "cuda"):
            l, c = copy.deepcopy(lstm).to(where), copy.deepcopy(cell).to(where)
            xi = x.to(where).detach().clone().requires_grad_()
            y, (h, cc) = l(xi)
            h1, c1 = c(xi[0])
            (y.pow(2).mean() + h.sum() + cc.sum() + h1.sum() + c1.sum()).backward()
            out[where] = [y.detach().cpu(), xi.grad.cpu(), l.weight_hh_l0.grad.cpu(), l.bias_ih_l1.grad.cpu(),
                          c.weight_ih.grad.cpu()]
            out[where + "_device"] = str(y.device)
        close = [torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(out["cpu"], out["cuda"])]
        print("RESULT " + json.dumps({"close": close, "device": out["cuda_device"]}))
    """)
    assert r == {"close": [True] * 5, "device": "npu:0"}


def test_torch_compile_of_a_module_on_the_npu(tmp_path):
    """torch.cuda.StreamContext on the npu was the emulated device's torch.npu.StreamContext, a function:
    dynamo asks isinstance(value, torch.cuda.StreamContext) when it wraps a module, and every frame failed
    ('isinstance() arg 2 must be a type'; gpt-fast --compile, extension-cpp's compile test)."""
    r = run_on_npu(tmp_path, """
        import json, torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).cuda()
        f = torch.compile(lambda x: m(x) * 2, backend="eager", fullgraph=True)
        x = torch.randn(3, 4, device="cuda")
        y = f(x)
        with torch.cuda.stream(torch.cuda.Stream()):
            z = m(x)
        print("RESULT " + json.dumps({"equal": torch.equal(y.cpu(), (m(x) * 2).cpu()), "device": str(y.device),
              "is_class": isinstance(torch.cuda.StreamContext, type), "in_stream": str(z.device)}))
    """)
    assert r == {"equal": True, "device": "npu:0", "is_class": True, "in_stream": "npu:0"}


def test_cuda_streams_and_device_properties_on_the_npu(tmp_path):
    """torch.cuda.Stream(device=torch.device('cuda')) reached torch.npu.Stream with the cuda device, which it
    refuses, and torch.cuda.stream(stream=s) met the device's parameter name s (timm's prefetcher);
    torch.cuda.get_device_properties() was the device's, without CUDA's fields: 'no attribute major'
    (denoising-diffusion-pytorch's Attend), 'no attribute gcnArchName' (inductor's cache key)."""
    r = run_on_npu(tmp_path, """
        import functools, json, torch
        s = torch.cuda.Stream(device=torch.device("cuda"))
        ctx = functools.partial(torch.cuda.stream, stream=s)
        with ctx():
            y = torch.ones(2, device="cuda") * 2
        p = torch.cuda.get_device_properties(torch.device("cuda"))
        print("RESULT " + json.dumps({"stream": [isinstance(s, torch.cuda.Stream), str(s.device),
              str(torch.cuda.current_stream(torch.device("cuda", 0)).device)], "y": str(y.device),
              "props": [p.major, p.minor, p.gcnArchName, p.name == torch.npu.get_device_name(),
                        p.total_memory == torch.npu.get_device_properties().total_memory]}))
    """)
    assert r == {"stream": [True, "npu:0", "npu:0"], "y": "npu:0", "props": [0, 0, "", True, True]}


def test_torch_compile_under_run_report(tmp_path):
    """`torch-adapter run --report` records ops with a dispatch mode, and dynamo skipped every frame under it
    ('non-infra torch dispatch mode present'): torch.compile(fullgraph=True) raised (gpt-fast --compile,
    extension-cpp under the acceptance run's report), a plain torch.compile silently ran eager. The recorder
    lets compilation through now; the ops the program runs eagerly are still in the report."""
    report = tmp_path / "r.json"
    r = run_on_npu(tmp_path, """
        import json, torch
        import torch._dynamo
        m = torch.nn.Linear(4, 4).cuda()
        f = torch.compile(lambda x: torch.relu(m(x)) + 1, backend="eager", fullgraph=True)
        x = torch.randn(2, 4, device="cuda")
        y = f(x)
        z = torch.special.i0e(x)  # eager, and a fallback of the device: recorded
        print("RESULT " + json.dumps({"equal": torch.equal(y.cpu(), (torch.relu(m(x)) + 1).cpu()),
              "frames": torch._dynamo.utils.counters["stats"]["unique_graphs"]}))
    """, "--report-json", str(report))
    assert r["equal"] is True and r["frames"] >= 1
    ops = {o["op"] for o in json.loads(report.read_text())["ops"]}
    assert any(op.startswith("aten::special_i0e") for op in ops)
