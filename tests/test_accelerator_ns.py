"""Device-agnostic programs (``torch.accelerator``) on the CPU target (issue 16's acceptance run).

pytorch/examples' FSDP2 and tensor-parallel scripts ask ``torch.accelerator`` for the device
and refuse to start without one per rank ("Unable to locate sufficient 2 gpus"); vae,
siamese_network, mnist_rnn took their CPU path and never met the adapter. While installed
on the CPU, the program sees ``torch.accelerator`` as ``torch.cuda`` answers it, with one
device per local rank under a launcher; torch's own modules still see the truth.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

import torch_adapter
from conftest import run_cli

# The shape of pytorch/examples' device-agnostic code (mnist, vae, FSDP2), written here.
DEVICE_AGNOSTIC = textwrap.dedent("""
    import os, sys, torch
    if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= int(sys.argv[1])):
        sys.exit("Unable to locate sufficient accelerators")
    acc = torch.accelerator.current_accelerator()
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"{acc.type}:{rank}")
    torch.accelerator.set_device_index(rank)
    with torch.accelerator.device_index(rank):
        assert torch.accelerator.current_device_index() == rank
    model = torch.nn.Linear(4, 2).to(device)
    loss = model(torch.randn(3, 4, device=device)).sum()
    loss.backward()
    torch.accelerator.synchronize()
    print(f"rank {rank} on {acc.type} -> {loss.device.type}, accelerators {torch.accelerator.device_count()}")
""")


def test_device_agnostic_code_gets_the_target_as_its_accelerator():
    before = (torch.accelerator.is_available(), torch.accelerator.current_accelerator())
    torch_adapter.install("cpu")
    try:
        assert torch.accelerator.is_available()
        acc = torch.accelerator.current_accelerator()
        assert acc is not None and acc.type == "cuda"
        assert torch.accelerator.device_count() == torch.cuda.device_count() == 1
        model = nn.Linear(3, 1).to(acc)
        out = model(torch.ones(2, 3, device=torch.device(f"{acc.type}:0")))
        assert out.device.type == "cpu" and model.weight.device.type == "cpu"
        torch.accelerator.set_device_index(0)
        assert torch.accelerator.current_device_index() == 0
    finally:
        torch_adapter.uninstall()
    assert (torch.accelerator.is_available(), torch.accelerator.current_accelerator()) == before


def test_torchs_own_modules_still_see_the_machine():
    """torch's DataParallel stream helper asks torch.accelerator: on the host it must get "no stream"."""
    from torch.nn.parallel import _functions

    torch_adapter.install("cpu")
    try:
        assert torch.accelerator.is_available()  # the program's view
        assert _functions._get_stream(torch.device("cuda", 0)) is None  # torch's view: no accelerator here
    finally:
        torch_adapter.uninstall()


def test_a_script_needing_one_accelerator_runs_on_it(tmp_path):
    (tmp_path / "agnostic.py").write_text(DEVICE_AGNOSTIC)
    res = run_cli("run", str(tmp_path / "agnostic.py"), "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 on cuda -> cpu, accelerators 1" in res.stdout


FSDP2_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    if torch.accelerator.device_count() < int(os.environ["WORLD_SIZE"]):   # pytorch/examples' FSDP2 guard
        sys.exit(f"Unable to locate sufficient {os.environ['WORLD_SIZE']} gpus")
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")
    torch.accelerator.device_index(rank)
    dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=device)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            m.reset_parameters()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = model(torch.randn(4, 8, device=device)).sum()
    loss.backward()
    opt.step()
    print(f"rank {rank} fsdp2 step on {loss.device.type} with {dist.get_backend()}", flush=True)
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("script,needle", [(DEVICE_AGNOSTIC, "on cuda -> cpu, accelerators 2"),
                                           (FSDP2_SCRIPT, "fsdp2 step on cpu with gloo")], ids=["agnostic", "fsdp2"])
def test_under_torchrun_each_local_rank_has_its_accelerator(tmp_path, script, needle):
    (tmp_path / "s.py").write_text(script)
    res = run_cli("run", "torchrun", "--standalone", "--nproc-per-node", "2", str(tmp_path / "s.py"), "2",
                  cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} {needle}" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


def test_docs_section_is_in_sync():
    from pathlib import Path

    from torch_adapter.redirect.accelerator import accelerator_markdown

    doc = (Path(__file__).resolve().parent.parent / "docs" / "cuda-namespace.md").read_text()
    assert accelerator_markdown() in doc, "regenerate with: python -m torch_adapter.redirect.cuda_table > docs/cuda-namespace.md"


# -- who the caller is: the nearest frame past pass-through frames decides (redirect/accelerator.py) --
def _decorated(how: str):
    import functools

    acc = torch.accelerator.current_accelerator
    return {"torch.compiler.disable(fn)": lambda: torch.compiler.disable(acc),
            "torch.no_grad()(fn)": lambda: torch.no_grad()(acc),
            "torch.inference_mode()(fn)": lambda: torch.inference_mode()(acc),
            "torch.enable_grad()(fn)": lambda: torch.enable_grad()(acc),
            "torch.no_grad()(functools.partial(fn))": lambda: torch.no_grad()(functools.partial(acc)),
            "torch.compiler.disable(torch.no_grad()(fn))": lambda: torch.compiler.disable(torch.no_grad()(acc)),
            }[how]()


@pytest.mark.parametrize("how", ["torch.compiler.disable(fn)", "torch.no_grad()(fn)", "torch.inference_mode()(fn)",
                                 "torch.enable_grad()(fn)", "torch.no_grad()(functools.partial(fn))",
                                 "torch.compiler.disable(torch.no_grad()(fn))"])
def test_torchs_decorator_wrappers_around_the_programs_call_are_not_the_caller(how):
    """torch's wrapper frames (torch.utils._contextlib, torch._dynamo.eval_frame) only carry the
    program's call: the program gets its answer, not torch's."""
    torch_adapter.install("cpu")
    try:
        assert _decorated(how)() == torch.device("cuda")
    finally:
        torch_adapter.uninstall()


def test_torchs_own_code_calling_through_a_wrapper_still_gets_torchs_answer():
    namespace = {"__name__": "torch._torch_adapter_test_internal", "torch": torch}
    exec("def internal():\n    return torch.no_grad()(torch.accelerator.current_accelerator)()", namespace)
    torch_adapter.install("cpu")
    try:
        assert namespace["internal"]() is None  # torch's truth on this CPU build
        assert torch.accelerator.current_accelerator() == torch.device("cuda")  # the program's
    finally:
        torch_adapter.uninstall()


def test_atexit_callbacks_are_the_programs_calls(tmp_path):
    """An atexit callback runs with no Python frame above it: the program's call, answered (it
    raised "call stack is not deep enough")."""
    script = tmp_path / "at_exit.py"
    script.write_text(textwrap.dedent("""
        import atexit, functools, torch
        atexit.register(lambda: print("wrapped:", torch.accelerator.current_accelerator()))
        atexit.register(torch.accelerator.synchronize)
        atexit.register(torch.accelerator.current_accelerator)
        atexit.register(functools.partial(torch.accelerator.device_count))
    """))
    res = run_cli("run", str(script), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Exception ignored" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "wrapped: cuda" in res.stdout
