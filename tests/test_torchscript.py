"""TorchScript under the adapter (redirect/torchscript.py), before / during / after a session.

TorchScript recognises torch's functions by identity (``torch.jit._builtins``: id → aten op)
and compiles the source of anything else; the adapter's factory wrappers broke every script
that calls a factory, torch modules that script at import (``torch.distributed.optim``, the
modules forward-mode AD imports), and device constants inside graphs call aten directly.
Each case runs in a fresh interpreter, from a file (TorchScript reads the source), because
what matters is what was imported or compiled before ``install()``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import io, json, sys, warnings
warnings.simplefilter("ignore")
import torch
import torch_adapter

def run(fn):  # the outcome of one call, as text: a value or the error's type
    try:
        out = fn()
        return out.tolist() if isinstance(out, torch.Tensor) else out
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"
"""


def _run(tmp_path, body: str) -> dict:
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(_PRELUDE) + textwrap.dedent(body))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_scripted_functions_calling_factories_before_during_and_after(tmp_path):
    got = _run(tmp_path, """
        @torch.jit.script
        def before(x):
            return torch.zeros_like(x) + torch.ones(3) + torch.arange(3)

        torch_adapter.install("cpu")

        def scripted_during():
            @torch.jit.script
            def during(x):
                return torch.full_like(x, 2.0) + torch.empty(3).fill_(1) + torch.arange(3, dtype=torch.float32)
            return during
        during = run(scripted_during)
        out = {"before_during": run(lambda: before(torch.ones(3))),
               "during": run(lambda: during(torch.ones(3))) if not isinstance(during, str) else during}
        torch_adapter.uninstall()
        out["during_after"] = run(lambda: during(torch.ones(3))) if not isinstance(during, str) else during

        @torch.jit.script
        def after(x):
            return torch.ones_like(x) + torch.zeros(3)
        out["after"] = run(lambda: after(torch.ones(3)))
        print(json.dumps(out))
    """)
    assert got == {"before_during": [1.0, 2.0, 3.0], "during": [3.0, 4.0, 5.0], "during_after": [3.0, 4.0, 5.0],
                   "after": [1.0, 1.0, 1.0]}


@pytest.mark.parametrize("scripted", ["before-install", "during-install"])
def test_a_scripted_module_naming_cuda_inside_runs_on_the_target(tmp_path, scripted):
    got = _run(tmp_path, f"""
        @torch.jit.script
        def helper(x):
            return x.to("cuda") + torch.ones(2, device="cuda:0")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(2, 2)

            def forward(self, x):
                d = torch.device("cuda")
                return self.lin(x.cuda()) + torch.zeros(2, device=d) + helper(x)

        if {scripted == "before-install"!r}:
            net = torch.jit.script(Net())
        session = torch_adapter.install("cpu")
        if {scripted == "during-install"!r}:
            net = torch.jit.script(Net())
        net = net.cuda()
        x = torch.ones(2, device="cuda")
        y = run(lambda: net(x).device.type)
        rows = [e["asked"] for e in session.redirect_log.to_json()["entries"] if e["kind"] == "jit"]
        print(json.dumps({{"device": y, "rows": rows}}))
    """)
    assert got["device"] == "cpu"
    assert any("Net.forward: device 'cuda'" in r for r in got["rows"]), got["rows"]
    assert any(".cuda()" in r for r in got["rows"]) and any("helper" in r for r in got["rows"])


@pytest.mark.parametrize("imported", ["before-install", "during-install"])
def test_zero_redundancy_and_a_functional_optimizer_import_and_step(tmp_path, imported):
    got = _run(tmp_path, f"""
        import os
        import torch.distributed as dist
        if {imported == "before-install"!r}:
            from torch.distributed.optim import ZeroRedundancyOptimizer
        torch_adapter.install("cpu")
        assert ("torch.distributed.optim" in sys.modules) == {imported == "before-install"!r}
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.distributed.optim.functional_sgd import _FunctionalSGD

        store = os.path.abspath("rendezvous")  # a file, not a port: no race with other processes
        dist.init_process_group("nccl", init_method=f"file://{{store}}", rank=0, world_size=1)
        model = torch.nn.Linear(3, 1).cuda()
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.5)
        model(torch.ones(2, 3, device="cuda")).sum().backward()
        w0 = model.weight.detach().clone()
        zero.step()
        p = torch.zeros(2)
        _FunctionalSGD([p], lr=1.0).step([torch.ones(2)])
        print(json.dumps({{"backend": dist.get_backend(), "moved": (w0 - model.weight).tolist(),
                          "functional": p.tolist()}}))
        dist.destroy_process_group()
    """)
    assert got["backend"] == "gloo"
    assert got["moved"] == [[1.0, 1.0, 1.0]]  # lr 0.5 × grad 2 (two rows of ones)
    assert got["functional"] == [-1.0, -1.0]


def test_trace_save_load_with_each_map_location_and_cuda_of_the_loaded_module(tmp_path):
    got = _run(tmp_path, """
        torch.manual_seed(0)
        traced = torch.jit.trace(torch.nn.Linear(2, 2), torch.ones(1, 2))
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        want = traced(torch.ones(1, 2)).tolist()

        def load(where):
            buf.seek(0)
            return torch.jit.load(buf, map_location=where)(torch.ones(1, 2))

        forms = {"'cuda'": "cuda", "'cuda:0'": "cuda:0", "0": 0, "device('cuda')": torch.device("cuda")}
        torch_adapter.install("cpu")
        out = {name: run(lambda: load(where)) for name, where in forms.items()}

        def moved(how):
            buf.seek(0)
            m = torch.jit.load(buf)
            m = m.cuda() if how == "cuda()" else m.to(how)
            return m(torch.ones(1, 2, device="cuda"))
        out.update({how: run(lambda: moved(how)) for how in ("cuda()", "cuda", 0)})
        print(json.dumps({"want": want, "out": out}))
    """)
    assert got["out"] == {k: got["want"] for k in ("'cuda'", "'cuda:0'", "0", "device('cuda')", "cuda()", "cuda", "0")}


def test_a_loaded_archive_with_cuda_constants_and_storages_runs_on_the_target(tmp_path):
    got = _run(tmp_path, """
        import zipfile

        @torch.jit.script
        def shift(x):
            return x.to("cuda") + torch.ones(2, device="cuda")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(2, 2)

            def forward(self, x):
                return self.lin(x) + shift(x) + torch.zeros(2, device="cuda:0")

        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(Net()), buf)
        # as if saved on a CUDA machine: the tensors' location 'cpu' → 'cuda' in data.pkl
        cuda_buf = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, zipfile.ZipFile(cuda_buf, "w") as zout:
            for info in zin.infolist():
                data = zin.read(info)
                if info.filename.endswith("/data.pkl"):
                    data = data.replace(b"X\\x03\\x00\\x00\\x00cpu", b"X\\x04\\x00\\x00\\x00cuda")
                zout.writestr(info, data)

        def load(b):
            b.seek(0)
            return torch.jit.load(b)(torch.ones(2)).device.type
        out = {"plain_cuda_storages": run(lambda: load(cuda_buf))}
        torch_adapter.install("cpu")
        out["cuda_constants"] = run(lambda: load(buf))
        out["cuda_storages"] = run(lambda: load(cuda_buf))
        print(json.dumps(out))
    """)
    assert "cuda" in got["plain_cuda_storages"]  # the crafted archive really names CUDA
    assert got["cuda_constants"] == "cpu" and got["cuda_storages"] == "cpu"


@pytest.mark.parametrize("imported", ["before-install", "during-install"])
def test_forward_mode_ad_of_cpu_code_under_the_adapter(tmp_path, imported):
    got = _run(tmp_path, f"""
        if {imported == "before-install"!r}:
            import torch.func, torch.autograd.forward_ad
        torch_adapter.install("cpu")
        import torch.func
        import torch.autograd.forward_ad as fwAD
        x = torch.tensor([0.0, 1.0], dtype=torch.float64)
        out = {{"jvp": run(lambda: torch.func.jvp(torch.sin, (x,), (torch.ones_like(x),))[1])}}

        def dual():
            with fwAD.dual_level():
                d = fwAD.make_dual(x, torch.ones_like(x))
                return fwAD.unpack_dual(torch.exp(d)).tangent
        out["make_dual"] = run(dual)
        out["gradcheck"] = run(lambda: torch.autograd.gradcheck(torch.tanh, (x.clone().requires_grad_(),),
                                                               check_forward_ad=True))
        print(json.dumps(out))
    """)
    assert got["jvp"] == pytest.approx([1.0, 0.5403023058681398])
    assert got["make_dual"] == pytest.approx([1.0, 2.718281828459045])
    assert got["gradcheck"] is True


def test_the_builtin_table_is_exactly_as_before_after_uninstall(tmp_path):
    got = _run(tmp_path, """
        import torch.jit._builtins as builtins
        before = dict(builtins._get_builtin_table())
        session = torch_adapter.install("cpu")
        during = dict(builtins._get_builtin_table())
        wrapper = torch.zeros
        patched = {id(v) for v in session.patcher.values()}
        torch_adapter.uninstall()
        after_quiet = dict(builtins._get_builtin_table())

        session = torch_adapter.install("cpu")  # a second session that scripts and loads
        patched |= {id(v) for v in session.patcher.values()}

        def f(x):
            return torch.zeros_like(x) + torch.ones(2)
        torch.jit.script(f)(torch.ones(2))
        buf = io.BytesIO()
        torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.ones(1, 2)), buf)
        buf.seek(0)
        torch.jit.load(buf, map_location="cuda")
        torch_adapter.uninstall()
        after = dict(builtins._get_builtin_table())
        print(json.dumps({
            "wrapper_registered": during.get(id(wrapper)), "quiet_equal": after_quiet == before,
            "before_kept": all(after.get(k) == v for k, v in before.items()),
            "adapter_ids_left": sorted(set(after) & patched - set(before)),
        }))
    """)
    assert got["wrapper_registered"] == "aten::zeros"
    assert got["quiet_equal"] is True  # same ids, same ops
    assert got["before_kept"] is True and got["adapter_ids_left"] == []
