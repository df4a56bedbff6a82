"""Compiled CUDA-written code compiles as in plain torch (issue 20, item 3): ``fullgraph=True``
functions that ask ``torch.device``, ``torch.cuda`` and ``torch.accelerator`` compile to one graph
with no break under the adapter and give eager's results; after ``uninstall()`` plain torch
compiles as in an interpreter that never installed, and dynamo's tables hold none of the
adapter's objects (redirect/compiling.py, accelerator.py, device_ordinal.py).

What matters is when torch._dynamo is first imported (it builds tables of torch's objects as it
is imported and at their first use), so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_CASES = """
import json, os, sys, types, torch

CUDA_CASES = {  # CUDA-written code: the adapter answers it
    "torch.device('cuda')": lambda x: x + torch.ones(4, device=torch.device("cuda")),
    "torch.device(0)": lambda x: x + torch.ones(4, device=torch.device(0)),
    "isinstance(d, torch.device)": lambda x: x + isinstance(torch.device("cuda", 0), torch.device),
    "torch.cuda.is_available()": lambda x: x + 1 if torch.cuda.is_available() else x - 1,
    "torch.cuda.current_device()": lambda x: x + torch.cuda.current_device(),
    "torch.cuda.device_count()": lambda x: x + torch.cuda.device_count(),
    "accelerator.current_accelerator()": lambda x: x.to(torch.accelerator.current_accelerator()) + 1,
    "accelerator.device_count()": lambda x: x + torch.accelerator.device_count(),
    "accelerator.is_available()": lambda x: x + torch.accelerator.is_available(),
    "accelerator.current_device_index()": lambda x: x + torch.accelerator.current_device_index(),
    "factory device='cuda'": lambda x: x + torch.arange(4, device="cuda") + torch.zeros(4, device="cuda:0"),
    "x.to('cuda')": lambda x: x.to("cuda") * 2,
    "x.cuda()": lambda x: x.cuda() * 3,
}
PLAIN_CASES = {  # what plain torch on this CPU build compiles (or breaks on) by itself
    "torch.device('cpu')": lambda x: x + torch.ones(4, device=torch.device("cpu")),
    "torch.cuda.is_available()": lambda x: x + 1 if torch.cuda.is_available() else x - 1,
    "torch.cuda.device_count()": lambda x: x + torch.cuda.device_count(),
    "accelerator.current_accelerator()": lambda x: x + (torch.accelerator.current_accelerator() is None),
    "accelerator.is_available()": lambda x: x + torch.accelerator.is_available(),
    "accelerator.device_count()": lambda x: x + torch.accelerator.device_count(),
    "factory": lambda x: x + torch.arange(4) + torch.zeros(4),
    "x.to('cpu')": lambda x: x.to("cpu") * 2,
}

def explain(cases):
    # graphs and breaks per function (torch._dynamo.explain); plain torch refuses some outright
    import torch._dynamo
    out = {}
    for name, fn in cases.items():
        try:
            e = torch._dynamo.explain(fn)(torch.ones(4))
            out[name] = {"graphs": e.graph_count, "breaks": e.graph_break_count}
        except Exception as exc:
            out[name] = {"error": str(exc).splitlines()[0]}
    return out

def same_as_eager(cases):
    # all of them in one fullgraph function through aot_eager (fake tensors, aten graph) vs eager
    every = lambda x: [fn(x) for fn in cases.values()]
    compiled = torch.compile(every, fullgraph=True, backend="aot_eager")(torch.ones(4))
    return {name: torch.equal(c, e) and c.device.type == "cpu"
            for name, c, e in zip(cases, compiled, every(torch.ones(4)))}

def adapter_objects(overrides=True):
    # every object of the adapter (its stand-ins, wrappers, classes) in a table of torch._dynamo:
    # module globals and class attributes, and the zero-argument caches they built. overrides=False
    # leaves out torch.overrides' own tables that dynamo reads: while installed they hold each
    # stand-in *beside* torch's function by design (redirect/torch_tables.py), removed at uninstall,
    # and so does dynamo's cache built from them (variables.torch.get_overridable_functions)
    import torch_adapter
    from torch_adapter.core import torch_private as tp
    home = os.path.dirname(torch_adapter.__file__)
    def ours(o):
        try:
            if isinstance(o, type):
                return "__torch_adapter_original__" in vars(o) or type(o).__module__.startswith("torch_adapter")
            code = getattr(o, "__code__", None)
            return (isinstance(code, types.CodeType) and code.co_filename.startswith(home)) or \\
                getattr(o, "__torch_adapter_original__", None) is not None
        except Exception:
            return False
    def members(v):
        return [*v.keys(), *v.values()] if isinstance(v, dict) else list(v) if isinstance(v, (set, frozenset, list, tuple)) else []
    found = set()
    for mname, mod in list(sys.modules.items()):
        if mod is None or not mname.startswith("torch._dynamo"):
            continue
        for gname, v in list(vars(mod).items()):
            places = [(gname, v)] + ([(f"{gname}.{k}", getattr(c, "__func__", c)) for k, c in vars(v).items()]
                                     if isinstance(v, type) and v.__module__ == mname else [])
            for label, val in places:
                found |= {f"{mname}.{label}" for m in members(val) if ours(m)}
    for table in tp.dynamo_tables():
        if not overrides and getattr(getattr(table.obj, "__wrapped__", None), "__name__", "") == "get_overridable_functions":
            continue
        if table.built() and table.kind != "ids":
            content = table.obj() if table.kind == "cache" else table.module._CLOSURE_VARS
            found |= {repr(table.obj) for m in members(content) if ours(m)}
    return sorted(found)
"""


def _run(body: str) -> dict:
    code = textwrap.dedent(_CASES) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain_torch() -> dict:
    """The same plain-torch functions compiled in an interpreter that never installed the adapter."""
    return _run("print(json.dumps(explain(PLAIN_CASES)))")


@pytest.mark.parametrize("dynamo_first", [False, True], ids=["dynamo-imported-in-the-session", "dynamo-imported-before"])
def test_fullgraph_cuda_code_has_no_graph_break_and_plain_torch_compiles_as_before_after_uninstall(
        dynamo_first, plain_torch):
    got = _run(f"""
        if {dynamo_first}:
            import torch._dynamo
        import torch_adapter
        torch_adapter.install(target="cpu")
        assert ("torch._dynamo" in sys.modules) == {dynamo_first}
        during = explain(CUDA_CASES)
        same = same_as_eager(CUDA_CASES)
        held_during = adapter_objects(overrides=False)
        torch_adapter.uninstall()
        after = explain(PLAIN_CASES)
        print(json.dumps({{"during": during, "same": same, "after": after, "held_during": held_during,
                          "held_after": adapter_objects()}}))
    """)
    bad = {name: r for name, r in got["during"].items() if r != {"graphs": 1, "breaks": 0}}
    assert not bad, f"under the adapter, not one graph without a break: {bad}"
    assert all(got["same"].values()), f"compiled results differ from eager's under the adapter: {got['same']}"
    assert got["after"] == plain_torch, "after uninstall() plain torch compiles differently than it does by itself"
    assert got["held_during"] == [], f"dynamo's tables hold the adapter's objects: {got['held_during']}"
    assert got["held_after"] == [], f"dynamo's tables still hold the adapter's objects: {got['held_after']}"


def test_code_compiled_in_the_session_is_not_reused_after_uninstall():
    """Compiled code guards on the stand-ins it traced: after uninstall() it recompiles and gives
    plain torch's answers (torch.accelerator: none on this CPU build), not the session's."""
    got = _run("""
        import torch_adapter
        def fn(x):
            acc = torch.accelerator.current_accelerator()
            return x + (0 if acc is None else 10) + torch.cuda.is_available()
        compiled = torch.compile(fn, fullgraph=True, backend="eager")
        torch_adapter.install(target="cpu")
        during = compiled(torch.zeros(1)).item()
        torch_adapter.uninstall()
        after = compiled(torch.zeros(1)).item()
        print(json.dumps({"during": during, "after": after, "eager": fn(torch.zeros(1)).item()}))
    """)
    assert got == {"during": 11.0, "after": 0.0, "eager": 0.0}
