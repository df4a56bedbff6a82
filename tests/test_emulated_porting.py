"""Defects the public-program acceptance run on the emulated npu found in stops 42 and 43, one distilled
check each.

Each check runs a small CUDA-written script under ``torch-adapter run --target npu --emulate`` (or torchrun
ranks of it) in fresh interpreters: the device is process-wide and nothing here starts it in pytest's process.

- pytorch/examples FSDP2 ``reset_parameters`` after ``to_empty``: DTensor's RNG tracker read the device's
  state as a Philox state (``AssertionError``);
- the same example on rank 1: ``torch.npu.is_initialized()`` was always True, so DeviceMesh never set the
  device to LOCAL_RANK and FSDP2 mixed ``npu:0`` and ``npu:1``;
- ``mnist_hogwild --cuda``: device tensors could not be sent to another process (``_share_fd_: only available
  on CPU``);
- imagenet ``main_worker``: ``current_accelerator().type == 'cuda'`` was False on the npu target, so the model
  stayed on the host;
- imagenet's default ``DataParallel(model).cuda()``: ``torch._C has no attribute '_scatter'`` (a CPU build);
- pytorch/examples fsdp_tp_example: attention took the math decomposition on the device, whose causal mask
  could not mix with DTensor inputs;
- llm.c / gpt-fast ``--compile``: inductor has no code generator for the device (``KeyError: 'npu'``).
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


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return env


def _results(p: subprocess.CompletedProcess, cwd) -> list[dict]:
    """The RESULT lines a single process printed, or the ``result-<rank>.json`` files torchrun's ranks wrote."""
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    files = sorted(cwd.glob("result-*.json"))
    assert p.returncode == 0 and (lines or files), \
        f"rc={p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-6000:]}"
    return [json.loads(f.read_text()) for f in files] + [json.loads(ln[len("RESULT "):]) for ln in lines]


def run(tmp_path, code: str, *flags: str, ranks: int = 0, timeout: int = 300) -> list[dict]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
                if ranks else [sys.executable])
    p = subprocess.run([*launcher, "-m", "torch_adapter", "run", *flags, str(script)], capture_output=True,
                       text=True, env=_env(), timeout=timeout, cwd=str(tmp_path))
    return _results(p, tmp_path)


NPU = ("--target", "npu", "--emulate")


def test_lazy_initialisation_is_the_programs(tmp_path):
    """Not initialised until the program's first device tensor (the emulator's start-up probe does not count),
    then initialised; torch.cuda.is_initialized() answers the target's state."""
    (r,) = run(tmp_path, """
        import json, torch
        before = [torch.npu.is_initialized(), torch.cuda.is_initialized(), torch.cuda.device_count() > 0]
        x = torch.ones(2, device="cuda")
        after = [torch.npu.is_initialized(), torch.cuda.is_initialized()]
        print("RESULT " + json.dumps({"before": before, "after": after, "device": str(x.device)}))
    """, *NPU)
    assert r == {"before": [False, False, True], "after": [True, True], "device": "npu:0"}


def test_device_tensors_are_shared_with_spawned_processes(tmp_path):
    """Hogwild: a spawned child updates the parent's device tensor and parameter in place (shared memory),
    a tensor sent twice is one storage there, and the parent's device memory statistics still count it."""
    (r,) = run(tmp_path, """
        import json, torch, torch.multiprocessing as mp

        def child(t, p, again, q):
            t.add_(1)
            p.data.mul_(2)
            q.put([t.device.type, type(p).__name__, p.requires_grad, t.data_ptr() == again.data_ptr()])

        if __name__ == "__main__":
            t = torch.zeros(4, device="cuda")
            p = torch.nn.Parameter(torch.ones(3, device="cuda"))
            used = torch.cuda.memory_allocated()
            mp.set_start_method("spawn", force=True)
            q = mp.Queue()
            procs = [mp.Process(target=child, args=(t, p, t, q)) for _ in range(2)]
            for x in procs:
                x.start()
            seen = [q.get(timeout=120) for _ in procs]
            for x in procs:
                x.join()
            print("RESULT " + json.dumps({"seen": seen, "t": t.tolist(), "p": p.tolist(),
                                          "counted": torch.cuda.memory_allocated() >= used > 0,
                                          "codes": [x.exitcode for x in procs]}))
    """, *NPU)
    assert r["codes"] == [0, 0]
    assert r["seen"] == [["npu", "Parameter", True, True]] * 2
    assert r["t"] == [2.0] * 4 and r["p"] == [4.0] * 3
    assert r["counted"]


def test_fsdp2_meta_init_on_two_ranks(tmp_path):
    """pytorch/examples FSDP2's start: the device never selected (its ``torch.accelerator.device_index(rank)``
    is a context manager it does not enter), meta init, fully_shard, to_empty, init.normal_ on the sharded
    parameters (a DTensor random op), a forward and backward. Each rank must end on npu:<LOCAL_RANK>
    (DeviceMesh selects it) with finite parameters and gradients, and DTensor randn works."""
    results = run(tmp_path, """
        import json, os, torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor, randn
        from torch.distributed.device_mesh import init_device_mesh

        rank = int(os.environ["LOCAL_RANK"])
        device = torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")
        dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
        torch.manual_seed(0)
        with torch.device("meta"):
            model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 16))
        fully_shard(model)
        model.to_empty(device=device)
        for p in model.parameters():
            torch.nn.init.normal_(p)
        x = torch.randint(0, 64, (4, 8), device=device)
        model(x).sum().backward()
        mesh = init_device_mesh("cuda", (2,))
        r = randn(4, 4, device_mesh=mesh)
        w = model[0].weight
        result = {
            "rank": rank, "backend": dist.get_backend(), "current": torch.npu.current_device(),
            "local": str(w.to_local().device), "dtensor": isinstance(w, DTensor),
            "finite": all(bool(p.full_tensor().isfinite().all()) for p in model.parameters()),
            "grads": all(p.grad is not None for p in model.parameters()), "randn": list(r.shape)}
        with open(f"result-{rank}.json", "w") as f:  # one file a rank: torchrun interleaves the ranks' stdout
            json.dump(result, f)
        dist.destroy_process_group()
    """, *NPU, ranks=2)
    by_rank = {r["rank"]: r for r in results}
    assert set(by_rank) == {0, 1}
    for rank, r in by_rank.items():
        assert r == {"rank": rank, "backend": "hccl", "current": rank, "local": f"npu:{rank}", "dtensor": True,
                     "finite": True, "grads": True, "randn": [4, 4]}


def test_current_accelerator_is_the_programs_cuda(tmp_path):
    """On the npu target the program asks torch.accelerator and is told ``cuda`` (its CUDA path, which the
    adapter maps), while torch's own callers get the real device; the model then lands on the npu."""
    (r,) = run(tmp_path, """
        import json, torch
        import torch.distributed.distributed_c10d as c10d
        device = torch.accelerator.current_accelerator()
        model = torch.nn.Linear(2, 2)
        if device.type == "cuda":
            model.cuda(device)
        print("RESULT " + json.dumps({"program": device.type, "count": torch.accelerator.device_count(),
                                      "param": str(next(model.parameters()).device),
                                      "torch": str(torch._C._accelerator_getAccelerator())}))
    """, *NPU)
    assert r == {"program": "cuda", "count": 1, "param": "npu:0", "torch": "npu"}


def test_data_parallel_runs_the_module_on_the_device(tmp_path):
    """imagenet's default path, ``torch.nn.DataParallel(model).cuda()``: DataParallel splits a batch with
    torch._C._scatter, which only CUDA builds of torch have (torch_npu's and the emulated npu's torch is a CPU
    build: "torch._C has no attribute '_scatter'"). It runs the module on the device as it is, forward and
    backward, with the gradients of the plain module; ``data_parallel(...)`` too."""
    (r,) = run(tmp_path, """
        import json, torch
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        ref = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        ref.load_state_dict(m.state_dict())
        dp = torch.nn.DataParallel(m).cuda()
        x = torch.randn(8, 6).cuda(non_blocking=True)
        y = dp(x)
        y.sum().backward()
        xr = x.cpu()
        ref(xr).sum().backward()
        f = torch.nn.parallel.data_parallel(m, x)
        print("RESULT " + json.dumps({"out": str(y.device), "param": str(m[0].weight.device),
                                      "same": bool(torch.allclose(y.cpu(), ref(xr))),
                                      "grad": bool(torch.allclose(m[0].weight.grad.cpu(), ref[0].weight.grad)),
                                      "functional": str(f.device), "has_scatter": hasattr(torch._C, "_scatter")}))
    """, *NPU)
    assert r == {"out": "npu:0", "param": "npu:0", "same": True, "grad": True, "functional": "npu:0",
                 "has_scatter": False}


def test_attention_is_the_devices_fused_kernel(tmp_path):
    """Ascend's table lists ``_fused_sdp_choice`` and ``scaled_dot_product_attention``: the device picks its
    attention kernel (torch_npu registers the choice; without one torch takes the math decomposition). On the
    emulated npu the choice is the host's flash kernel, run as a device kernel (no fallback, no copies), with
    the host's numbers forward and backward."""
    (r,) = run(tmp_path, """
        import json, torch, torch_adapter
        import torch.nn.functional as F
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
        qd, kd, vd = (t.detach().cuda().requires_grad_() for t in (q, k, v))
        with torch_adapter.trace() as log:
            out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
            out.sum().backward()
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ref.sum().backward()
        routes = {}
        for row in log.table():
            routes.setdefault(row["op"], set()).add(row["route"])
        print("RESULT " + json.dumps({
            "device": str(out.device), "out": bool(torch.allclose(out.cpu(), ref, atol=1e-6)),
            "grad": bool(all(torch.allclose(a.grad.cpu(), b.grad, atol=1e-5) for a, b in ((qd, q), (kd, k), (vd, v)))),
            "routes": {op: sorted(v) for op, v in routes.items()}}))
    """, *NPU)
    assert r["device"] == "npu:0" and r["out"] and r["grad"]
    assert r["routes"].get("aten::_scaled_dot_product_flash_attention_for_cpu") == ["native"], r["routes"]
    assert r["routes"].get("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == ["native"], r["routes"]
    assert not any("fallback" in v for v in r["routes"].values()), r["routes"]


def test_tensor_parallel_attention_on_two_ranks(tmp_path):
    """pytorch/examples fsdp_tp_example (Llama2, q/k/v sharded on the heads): with the math decomposition its
    causal mask, a plain tensor, met the DTensor inputs ("aten.add.Tensor got mixed torch.Tensor and
    DTensor"). The fused kernel has DTensor's strategies (redirect/dtensor_rules.py): heads stay sharded and
    the result is the unsharded attention's."""
    results = run(tmp_path, """
        import json, os, torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import distribute_tensor, Shard
        rank = int(os.environ["LOCAL_RANK"])
        mesh = init_device_mesh("cuda", (2,))
        torch.manual_seed(0)
        full = torch.randn(2, 4, 8, 16, device="cuda")
        q = distribute_tensor(full, mesh, [Shard(1)]).requires_grad_()
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        out.sum().backward()
        ref = F.scaled_dot_product_attention(full, full, full, is_causal=True)
        result = {"rank": rank, "placements": [str(p) for p in out.placements],
                  "same": bool(torch.allclose(out.full_tensor(), ref, atol=1e-6)),
                  "local": str(out.to_local().device), "grad": q.grad is not None}
        with open(f"result-{rank}.json", "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()
    """, *NPU, ranks=2)
    by_rank = {r["rank"]: r for r in results}
    assert set(by_rank) == {0, 1}
    for rank, r in by_rank.items():
        assert r == {"rank": rank, "placements": ["S(1)"], "same": True, "local": f"npu:{rank}",
                     "grad": True}


def test_compile_without_an_inductor_backend_for_the_target(tmp_path):
    """The default backend becomes aot_eager (logged) where inductor generates no code for the target; the
    compiled model computes on the device what eager does, backward included; a named backend is kept."""
    (r,) = run(tmp_path, """
        import json, torch
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8)).cuda()
        x = torch.randn(4, 8, device="cuda", requires_grad=True)
        y = torch.compile(m, mode="max-autotune")(x)
        y.sum().backward()
        g = x.grad.clone()
        x.grad = None
        m(x).sum().backward()
        seen = []
        def mine(gm, inputs):
            seen.append(len(gm.graph.nodes))
            return gm.forward
        torch.compile(m, backend=mine)(x)
        from torch_adapter.redirect.compiling import inductor_generates_for
        print("RESULT " + json.dumps({"device": str(y.device), "close": bool(torch.allclose(y, m(x))),
                                      "grad": bool(torch.allclose(g, x.grad)), "named_backend_ran": bool(seen),
                                      "inductor_npu": inductor_generates_for("npu"),
                                      "inductor_cpu": inductor_generates_for("cpu")}))
    """, *NPU, "--report")
    assert r == {"device": "npu:0", "close": True, "grad": True, "named_backend_ran": True,
                 "inductor_npu": False, "inductor_cpu": True}


def test_opcheck_on_the_device(tmp_path):
    """torch.library.opcheck on "cuda" inputs (pytorch/extension-cpp's suite): torch's autograd-registration
    check knows CPU/CUDA/XPU only; on the npu it checks the device's own key by the same rules, so a
    correctly registered op passes and one whose backend kernel builds an autograd graph is still refused."""
    (r,) = run(tmp_path, """
        import json, torch
        from torch.testing._internal.optests import autograd_registration_check

        @torch.library.custom_op("t42::mysin", mutates_args=())
        def mysin(x: torch.Tensor) -> torch.Tensor:
            return x.sin()

        @mysin.register_fake
        def _(x):
            return torch.empty_like(x)

        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        mysin.register_autograd(lambda ctx, g: g * ctx.saved_tensors[0].cos(), setup_context=setup)
        x = torch.randn(3, device="cuda", requires_grad=True)
        torch.library.opcheck(mysin, (x,))
        lib = torch.library.Library("t42b", "DEF")
        lib.define("bad(Tensor x) -> Tensor")
        lib.impl("bad", lambda x: x.sin() * 1, "CUDA")
        try:
            autograd_registration_check(torch.ops.t42b.bad.default, (x,), {})
            bad = "passed"
        except AssertionError as e:
            bad = "refused" if "autograd kernel" in str(e) else str(e)
        print("RESULT " + json.dumps({"device": str(x.device), "bad": bad}))
    """, *NPU)
    assert r == {"device": "npu:0", "bad": "refused"}
