"""torch's own subsystems before, during and after a session, in a fresh interpreter each
(docs/torch-subsystems.md). One small script per subsystem runs it in three phases —
``before`` install (cpu), ``during`` the session (the program's "cuda"), ``after`` uninstall
(cpu) — in both import orders: ``first-use-before`` (the subsystem imported and its tables
built before ``install()``) and ``first-use-during`` (its first import or use is in the
session; the ``before`` phase is then skipped). Artefacts written in the session (pickles,
saved programs, packages) are loaded again after ``uninstall()`` and, where the script says,
by a plain interpreter that never imports torch_adapter.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_adapter

ORDERS = ("first-use-before", "first-use-during")

PRELUDE = '''
import os, pickle, sys
import torch, torch_adapter
ORDER, OUT = sys.argv[1], sys.argv[2]
FRESH = None  # a module the "first-use-during" order must not have loaded before install()

def out(name):
    return os.path.join(OUT, name)

def phases(run):
    if ORDER == "first-use-before":
        run("before", "cpu")
    elif FRESH is not None:  # the order is real: not imported / not built yet
        assert (FRESH not in sys.modules) if isinstance(FRESH, str) else FRESH(), FRESH
    torch_adapter.install("cpu")
    run("during", "cuda")
    torch_adapter.uninstall()
    run("after", "cpu")
    print("PHASES-OK")
'''

FX = '''
FRESH = lambda: torch.overrides._get_tensor_methods.cache_info().currsize == 0
def run(phase, dev):
    import torch.fx
    class M(torch.nn.Module):
        def forward(self, x):
            on = torch.cuda.is_available()          # a constant at trace time
            d = torch.device(dev)
            y = torch.zeros_like(x, device=d) + torch.ones(3, device=dev) * on
            y = y + x.new_ones(3) + torch.arange(3, device=dev)    # a method on a Proxy: recorded as written
            return x + y + torch.full((3,), 2.0, device=d)
    gm = torch.fx.symbolic_trace(M())
    expected = M()(torch.zeros(3)).tolist()
    assert gm(torch.zeros(3)).tolist() == expected, (phase, gm.code)
    assert "cuda" not in gm.code, gm.code                    # torch.* factories trace the target's device
    ops = {(n.op, getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes}
    assert ("call_method", "new_ones") in ops, ops           # a Tensor method stays a method call
    assert gm.forward.__globals__["torch"] is torch
    back = pickle.loads(pickle.dumps(gm))
    assert back(torch.zeros(3)).tolist() == expected
    assert torch.fx.GraphModule(gm, gm.graph).code == gm.code
    with open(out(f"gm_{phase}.pkl"), "wb") as f:
        pickle.dump((gm, expected), f)
    if phase == "after":
        for p in ("before", "during"):
            if os.path.exists(out(f"gm_{p}.pkl")):
                old, exp = pickle.load(open(out(f"gm_{p}.pkl"), "rb"))
                assert old(torch.zeros(3)).tolist() == exp, p
phases(run)
'''
FX_PLAIN = '''
for p in ("before", "during", "after"):
    if os.path.exists(out(f"gm_{p}.pkl")):
        gm, exp = pickle.load(open(out(f"gm_{p}.pkl"), "rb"))
        assert gm(torch.zeros(3)).tolist() == exp, p
'''

EXPORT = '''
import io
def run(phase, dev):
    import torch.export
    class M(torch.nn.Module):
        def forward(self, x):
            d = torch.device(dev)                   # a device constant in the program
            return x + torch.ones(3, device=d) + torch.arange(3, device=dev).to(x.dtype) + torch.zeros_like(x, device=d)
    ep = torch.export.export(M(), (torch.zeros(3),))
    assert "cuda" not in ep.graph_module.code and "device(type='cpu')" in ep.graph_module.code
    assert ep.module()(torch.zeros(3)).tolist() == [1.0, 2.0, 3.0]
    assert ep.run_decompositions().module()(torch.zeros(3)).tolist() == [1.0, 2.0, 3.0]
    torch.export.save(ep, out(f"ep_{phase}.pt2"))
    for p in ("before", "during", "after"):
        if os.path.exists(out(f"ep_{p}.pt2")):
            assert torch.export.load(out(f"ep_{p}.pt2")).module()(torch.zeros(3)).tolist() == [1.0, 2.0, 3.0], p
phases(run)
'''
EXPORT_PLAIN = '''
for p in ("before", "during", "after"):
    if os.path.exists(out(f"ep_{p}.pt2")):
        assert torch.export.load(out(f"ep_{p}.pt2")).module()(torch.zeros(3)).tolist() == [1.0, 2.0, 3.0], p
'''

FUNC = '''
def run(phase, dev):
    from torch.func import functional_call, grad, jacrev, vmap
    def f(x):
        return (x * torch.ones(x.shape, device=dev) + torch.arange(3, device=dev)).sin().sum()
    assert [round(v, 4) for v in vmap(f)(torch.zeros(2, 3)).tolist()] == [1.7508, 1.7508]
    assert [round(v, 4) for v in grad(f)(torch.zeros(3)).tolist()] == [1.0, 0.5403, -0.4161]
    j = jacrev(lambda x: x * torch.full((3,), 2.0, device=dev))(torch.zeros(3))
    assert torch.equal(j, 2 * torch.eye(3))
    m = torch.nn.Linear(3, 1).to(dev)
    params = {k: torch.ones_like(v, device=dev) for k, v in m.named_parameters()}
    assert functional_call(m, params, (torch.ones(1, 3, device=dev),)).tolist() == [[4.0]]
    same = vmap(lambda x: x + torch.randn(3, device=dev), randomness="same")(torch.zeros(2, 3))
    assert torch.equal(same[0], same[1])
phases(run)
'''

OVERRIDES = '''
import torch.overrides as o
FRESH = lambda: o._get_overridable_functions.cache_info().currsize == 0

class Sub(torch.Tensor):
    seen = []
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})

class Mode(o.TorchFunctionMode):
    def __init__(self):
        super().__init__(); self.seen = []
    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))

def run(phase, dev):
    zl, z = torch.zeros_like, torch.zeros
    assert zl in o.get_overridable_functions()[torch] and z not in o.get_overridable_functions()[torch]
    assert z in o.get_ignored_functions() and zl in o.get_testing_overrides()
    assert o.resolve_name(zl) == "torch.zeros_like" and o.resolve_name(torch.Tensor.to) == "torch.Tensor.to"
    assert o.resolve_name(torch.Tensor.new_zeros) == "torch.Tensor.new_zeros"
    assert o.is_tensor_method_or_property(torch.Tensor.to)
    s = torch.zeros(2).as_subclass(Sub)
    assert o.has_torch_function((s,)) and not o.has_torch_function((torch.zeros(2),))
    Sub.seen.clear()
    r = torch.zeros_like(s, device=dev)
    assert Sub.seen == [zl] and Sub.seen[0] is zl and type(r) is Sub and r.device.type == "cpu", Sub.seen
    Sub.seen.clear()
    s.new_zeros(2, device=dev); s.to(dev)
    assert Sub.seen[:2] == [torch.Tensor.new_zeros, torch.Tensor.to], Sub.seen
    with Mode() as m:
        torch.zeros(2, device=dev); torch.ones_like(s, device=dev)
    assert m.seen == [z, torch.ones_like] and m.seen[0] is z, m.seen   # exactly the program's calls
phases(run)
'''

ONNX = '''
FRESH = "torch.onnx"
def run(phase, dev):
    import onnx
    import torch.onnx
    class M(torch.nn.Module):
        def forward(self, x):
            return x + torch.ones(3, device=torch.device(dev)) + torch.arange(3, device=dev)
    torch.onnx.export(M(), (torch.zeros(3),), out(f"m_{phase}.onnx"), optimize=False, verbose=False)
    model = onnx.load(out(f"m_{phase}.onnx"))
    onnx.checker.check_model(model)
    from onnx.reference import ReferenceEvaluator   # onnx's own interpreter runs the exported graph
    import numpy as np
    (y,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: np.zeros(3, dtype=np.float32)})
    assert y.tolist() == [1.0, 2.0, 3.0], y
phases(run)
'''

PACKAGE = '''
SRC = """
import torch
class M(torch.nn.Module):
    def __init__(self, dev):
        super().__init__()
        self.dev = torch.device(dev)
        self.w = torch.nn.Parameter(torch.full((3,), 2.0, device=dev))
    def forward(self, x):
        return x.to(self.dev) * self.w + torch.ones(3, device=self.dev)
"""
def run(phase, dev):
    from torch.package import PackageExporter, PackageImporter
    if OUT not in sys.path:
        with open(out("mymod.py"), "w") as f:
            f.write(SRC)
        sys.path.insert(0, OUT)
    import mymod
    with PackageExporter(out(f"p_{phase}.pt")) as pe:
        pe.extern("torch.**")
        pe.intern("mymod")
        pe.save_pickle("m", "model.pkl", mymod.M(dev))
    for p in ("before", "during", "after"):
        if os.path.exists(out(f"p_{p}.pt")):
            m = PackageImporter(out(f"p_{p}.pt")).load_pickle("m", "model.pkl")
            assert m.dev.type == ("cuda" if p == "during" else "cpu") and isinstance(m.dev, torch.device)
            if p != "during" or phase == "during":  # a model made in the session is a CUDA model
                assert m(torch.ones(3)).tolist() == [3.0, 3.0, 3.0], p
phases(run)
'''
PACKAGE_PLAIN = '''
from torch.package import PackageImporter
for p in ("before", "after"):
    if os.path.exists(out(f"p_{p}.pt")):
        assert PackageImporter(out(f"p_{p}.pt")).load_pickle("m", "model.pkl")(torch.ones(3)).tolist() == [3.0] * 3
m = PackageImporter(out("p_during.pt")).load_pickle("m", "model.pkl")   # made in the session: a CUDA model
assert m.dev == torch.device("cuda") and type(m.dev) is torch.device
'''

DEVICE_CONTEXT = '''
FRESH = "torch.utils._device"
def run(phase, dev):
    import torch.utils._device as ud
    with torch.device("meta"):
        assert torch.zeros(2).device.type == "meta" and torch.nn.Linear(2, 2).weight.device.type == "meta"
        assert torch.empty(2, device=dev).device.type == "cpu"
    with torch.device(dev):
        assert torch.ones(1).device.type == "cpu"
    torch.set_default_device(dev)
    try:
        assert torch.arange(2).device.type == "cpu"
    finally:
        torch.set_default_device(None)
    ctors = ud._device_constructors()
    assert torch.zeros in ctors and torch.empty in ctors
    wrapped = [f for f in ctors if hasattr(f, "__torch_adapter_original__")]
    assert bool(wrapped) == (phase == "during"), wrapped  # the stand-ins beside torch's, in the session only
phases(run)
'''

STAND_INS = '''
import copy
def objects(dev):
    return {
        "device0": torch.device(0) if dev == "cuda" else torch.device("cpu"), "device": torch.device(dev),
        "device_class": torch.device, "generator": torch.Generator(device=dev), "generator_class": torch.Generator,
        "rng_state": torch.cuda.get_rng_state() if dev == "cuda" else torch.get_rng_state(),
        "scaler": torch.cuda.amp.GradScaler(enabled=dev == "cuda"), "amp_scaler": torch.amp.GradScaler(dev),
        "zeros": torch.zeros, "is_available": torch.cuda.is_available, "tensor_to": torch.Tensor.to,
        "FloatTensor": torch.cuda.FloatTensor, "cuda_device": torch.cuda.device(0),
    }
SESSION_ONLY = ("stream", "event", "properties")  # the adapter's own objects (no torch counterpart pickles)

def run(phase, dev):
    objs = objects(dev)
    if phase == "during":
        objs.update(stream=torch.cuda.Stream(), event=torch.cuda.Event(enable_timing=True),
                    properties=torch.cuda.get_device_properties(0))
        assert isinstance(torch.device("cpu"), torch.device) and isinstance(torch.Generator(), torch.Generator)
    for name, obj in objs.items():
        copy.deepcopy(obj)
        back = pickle.loads(pickle.dumps(obj))
        if isinstance(obj, (type, type(len), type(run))):
            assert back is obj, name                    # by name: the session's object while installed
    with open(out(f"objs_{phase}.pkl"), "wb") as f:
        pickle.dump({k: v for k, v in objs.items() if phase != "during" or k not in SESSION_ONLY}, f)
    if phase == "during":
        with open(out("session_only.pkl"), "wb") as f:
            pickle.dump({k: objs[k] for k in SESSION_ONLY}, f)
    if phase == "after":
        loaded = pickle.load(open(out("objs_during.pkl"), "rb"))
        check_torch_own(loaded)
        pickle.load(open(out("session_only.pkl"), "rb"))

def check_torch_own(loaded):
    assert type(loaded["device"]) is torch.device and loaded["device"] == torch.device("cuda")
    assert loaded["device0"] == torch.device("cuda", 0)
    assert loaded["device_class"] is torch.device and loaded["generator_class"] is torch.Generator
    assert type(loaded["generator"]) is torch.Generator and loaded["zeros"] is torch.zeros
    assert loaded["is_available"] is torch.cuda.is_available and loaded["tensor_to"] is torch.Tensor.to
    assert loaded["FloatTensor"] is torch.cuda.FloatTensor and type(loaded["cuda_device"]) is torch.cuda.device
    assert vars(loaded["cuda_device"]).keys() == vars(torch.cuda.device(0)).keys()
if __name__ == "__main__" and ORDER != "plain":
    phases(run)
'''
STAND_INS_PLAIN = STAND_INS + '''
check_torch_own(pickle.load(open(out("objs_during.pkl"), "rb")))
assert "torch_adapter" not in sys.modules
pickle.load(open(out("session_only.pkl"), "rb"))  # the adapter's classes: importable, nothing installed
assert not torch.cuda.is_available()
'''

CHECKPOINT = '''
def run(phase, dev):
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).to(dev)
    def f(x):
        return torch.nn.functional.dropout(lin(x) + torch.randn(4, device=dev), 0.5).sum()
    for reentrant in (True, False):
        x = torch.ones(2, 4, device=dev, requires_grad=True)
        torch.manual_seed(1)
        checkpoint(f, x, use_reentrant=reentrant).backward()
        g, x.grad = x.grad.clone(), None
        torch.manual_seed(1)
        f(x).backward()
        assert torch.equal(g, x.grad), reentrant      # the recomputation replays the same RNG
    class F(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type=dev)
        def forward(ctx, x):
            return x * torch.ones(1, device=dev)
        @staticmethod
        @torch.amp.custom_bwd(device_type=dev)
        def backward(ctx, g):
            return g * torch.full((1,), 2.0, device=dev)
    x = torch.ones(2, device=dev, requires_grad=True)
    with torch.autocast(dev, dtype=torch.bfloat16):
        F.apply(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
phases(run)
'''

# name -> (script, plain-interpreter loader or None, extra modules it needs)
CASES = {
    "fx": (FX, FX_PLAIN, ()),
    "export": (EXPORT, EXPORT_PLAIN, ()),
    "functorch": (FUNC, None, ()),
    "overrides": (OVERRIDES, None, ()),
    "onnx": (ONNX, None, ("onnx", "onnxscript")),
    "package": (PACKAGE, PACKAGE_PLAIN, ()),
    "device_context": (DEVICE_CONTEXT, None, ()),
    "stand_ins": (STAND_INS, STAND_INS_PLAIN, ()),
    "checkpoint": (CHECKPOINT, None, ()),
}


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", list(CASES))
def test_subsystem_before_during_after(name, order, tmp_path):
    script, plain, needs = CASES[name]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{name}: {', '.join(missing)} not installed (pip install -e '.[dev]')")
    done = _run(PRELUDE + textwrap.dedent(script), order, str(tmp_path))
    assert done.returncode == 0 and "PHASES-OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
    if plain is not None and order == ORDERS[0]:
        loader = "import os, pickle, sys\nimport torch\nORDER, OUT = 'plain', sys.argv[1]\n"
        loader += "def out(name):\n    return os.path.join(OUT, name)\n"
        done = _run(loader + textwrap.dedent(plain) + "\nassert 'torch_adapter' not in sys.modules or "
                    f"{name == 'stand_ins'!r}\nprint('PLAIN-OK')", str(tmp_path))
        assert done.returncode == 0 and "PLAIN-OK" in done.stdout, done.stderr[-4000:]


@pytest.mark.xfail(strict=True, reason="a deliberate limit (docs/redirect.md, 'Why the stand-in stays'): the name "
                   "torch.device is a stand-in class while installed so that torch.device(0) means cuda:0, hence "
                   "type(d) is torch.device is False (isinstance, ==, hash and pickling are torch's)")
def test_type_of_a_device_is_torch_device_while_installed():
    torch_adapter.install("cpu")
    assert type(torch.device("cpu")) is torch.device


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
