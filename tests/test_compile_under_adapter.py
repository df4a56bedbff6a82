"""torch.compile of CUDA-written code under the adapter, and after it (a failure class found
while timing ``optimization_level="aggressive"``; redirect/compiling.py, optimizing.py).

- torch._dynamo looks torch's functions up by name once, at its first use. When that first use
  came under the adapter (a script's first ``torch.compile``), its tables held the adapter's
  wrappers instead of ``torch.arange`` & co.: every factory call in compiled code was a graph
  break, during the session and after ``uninstall()``.
- The optimization layer's global forward pre-hook got a new key per session, and dynamo guards
  compiled code on the global hooks: a model compiled in one ``adapted()`` block recompiled in
  the next (the aggressive step ran 4x slower than eager when blocks were re-entered).

Each case runs in a fresh interpreter: what matters is when torch._dynamo is first imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_COUNT = """
import json, sys, torch

def counters():  # imported late: when torch._dynamo is first imported is what a case varies
    from torch._dynamo.utils import counters
    return counters

def breaks():
    return sum(counters()["graph_break"].values())

def cuda_code(x):  # written for CUDA: factories and .to with device="cuda"
    return (x + torch.arange(4, device="cuda").float() + torch.ones(4, device=x.device)).to("cuda")

def plain_code(x):
    return x + torch.arange(4).float() + torch.zeros(4)
"""


def _run(body: str) -> dict:
    code = textwrap.dedent(_COUNT) + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dynamo_first", [False, True], ids=["dynamo-imported-under-the-adapter", "dynamo-imported-before"])
def test_factories_in_compiled_code_trace_without_graph_breaks_during_and_after(dynamo_first):
    got = _run(f"""
        if {dynamo_first}:
            import torch._dynamo
        import torch_adapter
        torch_adapter.install("cpu")
        assert ("torch._dynamo.trace_rules" in sys.modules) == {dynamo_first}
        y = torch.compile(cuda_code, backend="eager")(torch.zeros(4, device="cuda"))
        during = breaks()
        torch_adapter.uninstall()
        z = torch.compile(plain_code, backend="eager")(torch.zeros(4))
        print(json.dumps({{"during": during, "after": breaks() - during, "y": y.tolist(), "z": z.tolist(),
                          "device": y.device.type}}))
    """)
    assert got["device"] == "cpu" and got["y"] == [1.0, 2.0, 3.0, 4.0] and got["z"] == [0.0, 1.0, 2.0, 3.0]
    assert got["during"] == 0, "factory calls in compiled code broke the graph under the adapter"
    assert got["after"] == 0, "plain torch.compile broke the graph after uninstall()"


def test_a_compiled_model_is_not_recompiled_when_the_aggressive_session_is_entered_again():
    got = _run("""
        import torch_adapter
        torch.manual_seed(0)
        model = None
        frames = []
        for block in range(3):
            with torch_adapter.adapted("cpu", optimization_level="aggressive"):
                if model is None:
                    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).cuda()
                    x = torch.randn(2, 8, device="cuda")
                for _ in range(2):
                    model(x).sum().backward()
                frames.append(counters()["stats"]["unique_graphs"])
        compiled = [r for r in torch_adapter.optimization.layer.applied() if "compile" in r["what"]]
        print(json.dumps({"graphs": frames, "breaks": breaks()}))
    """)
    first, *later = got["graphs"]
    assert first >= 1, "the aggressive level compiled nothing"
    assert later == [first] * len(later), f"recompiled when the session was entered again: {got['graphs']}"
    assert got["breaks"] == 0


def test_cuda_graphs_asked_for_by_inductors_global_config_are_off_on_the_target(tmp_path):
    """gpt-fast sets torch._inductor.config.triton.cudagraphs = True at import: every compile then
    captured CUDA graphs on the CPU target and failed in inductor ('module torch._C has no attribute
    _cuda_cudaCachingAllocator_is_enabled'). Found by the real-program run (gpt-fast generate.py --compile)."""
    script = tmp_path / "global_cudagraphs.py"
    script.write_text(textwrap.dedent("""
        import torch, torch_adapter
        torch_adapter.install(target="cpu")
        import torch._inductor.config
        torch._inductor.config.triton.cudagraphs = True
        x = torch.randn(4, device="cuda")
        for mode in (None, "reduce-overhead"):
            fn = torch.compile(lambda t: t.sin() + 1, fullgraph=True, **({"mode": mode} if mode else {}))
            torch.testing.assert_close(fn(x), x.sin() + 1)
        rows = [e.asked for e in torch_adapter.current().redirect_log.entries()]
        assert any("triton.cudagraphs = True" in r for r in rows), rows
        print("OK")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
