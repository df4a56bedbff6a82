"""CUDA graphs on the CPU target: torch.cuda.CUDAGraph / graph / make_graphed_callables keep CUDA's
static-buffer semantics by emulation (redirect/cuda_graphs.py), compared with plain CPU torch
running the same computation eagerly. Plain CPU torch cannot make a CUDAGraph at all, so each
test fails without the adapter."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import torch_adapter
from conftest import run_cli


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def _warm_up(fn, iters: int = 3) -> None:
    """The docs' warm-up on a side stream before capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(iters):
            fn()
    torch.cuda.current_stream().wait_stream(s)


def test_mlp_forward_capture_replays_new_inputs_into_the_static_output():
    model = _mlp()
    plain = copy.deepcopy(model)
    torch_adapter.install("cpu")
    model = model.cuda()
    static_in = torch.randn(5, 8, device="cuda")
    _warm_up(lambda: model(static_in))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = model(static_in)
    out_obj = static_out
    for _ in range(2):  # twice, different inputs
        x = torch.randn(5, 8)
        static_in.copy_(x)
        g.replay()
        assert static_out is out_obj and torch.equal(static_out, plain(x).detach())
    g.reset()
    with pytest.raises(RuntimeError, match="no completed capture"):
        g.replay()


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01, capturable=True),
], ids=["sgd_momentum", "adam_capturable"])
def test_whole_network_capture_trains_as_plain_torch(make_opt):
    """PyTorch's "whole network capture": forward, backward and optimizer.step() in one graph."""
    torch_adapter.install("cpu")
    model = _mlp().cuda()
    opt = make_opt(model.parameters())
    loss_fn = nn.MSELoss()
    static_in, static_target = torch.randn(5, 8, device="cuda"), torch.randn(5, 4, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(static_in), static_target).backward()
        opt.step()

    _warm_up(step)
    torch_adapter.uninstall()
    plain = copy.deepcopy(model)  # the state after warm-up, trained eagerly by plain torch below
    plain_opt = make_opt(plain.parameters())
    plain_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    torch_adapter.install("cpu")

    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_fn(model(static_in), static_target)
        static_loss.backward()
        opt.step()
    assert _same(model, plain)  # as on CUDA, the capture itself ran no step
    for _ in range(2):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        static_in.copy_(x)
        static_target.copy_(y)
        g.replay()
        plain_opt.zero_grad(set_to_none=True)
        loss = loss_fn(plain(x), y)
        loss.backward()
        plain_opt.step()
        assert torch.equal(static_loss, loss.detach()) and _same(model, plain)


def test_make_graphed_callables_trains_as_eager():
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    plain = copy.deepcopy(model)
    torch_adapter.install("cpu")
    model = model.cuda()
    opt, plain_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(plain.parameters(), lr=0.1)
    graphed = torch.cuda.make_graphed_callables(model, (torch.randn(5, 8, device="cuda"),))
    for _ in range(3):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        for module, o in ((graphed, opt), (plain, plain_opt)):
            o.zero_grad(set_to_none=True)
            ((module(x) - y) ** 2).mean().backward()
            o.step()
        assert _same(model, plain)
    captures = [e for e in torch_adapter.redirect_log().entries() if e.asked == "torch.cuda.graph capture"]
    assert [e.count for e in captures] == [2] and captures[0].file == __file__  # forward and backward graphs


def test_random_ops_draw_new_numbers_per_replay_and_pool_and_stream_are_accepted():
    torch_adapter.install("cpu")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.Stream(),
                          capture_error_mode="thread_local"):
        noise = torch.rand(64, device="cuda")
        dropped = nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)
    with torch.cuda.graph(g2, pool=g1.pool()):
        doubled = noise * 2
    g1.replay()
    first, first_drop = noise.clone(), dropped.clone()
    g1.replay()
    assert not torch.equal(first, noise) and not torch.equal(first_drop, dropped)
    g2.replay()
    assert torch.equal(doubled, noise * 2)
    with pytest.raises(RuntimeError, match="capture_error_mode"):
        torch.cuda.graph(g1, capture_error_mode="loose")


@pytest.mark.parametrize("bad, call", [
    (lambda t: t.item(), "Tensor.item()"),
    (lambda t: t.cpu(), "Tensor.cpu()"),
    (lambda t: t.tolist(), "Tensor.tolist()"),
    (lambda t: print(t), "printing a tensor"),
    (lambda t: torch.cuda.synchronize(), "torch.cuda.synchronize()"),
    (lambda t: t.nonzero(), "aten::nonzero"),
    (lambda t: bool(t.sum() > 0), "aten::_local_scalar_dense"),
])
def test_what_a_cuda_graph_cannot_hold_fails_as_cuda_does(bad, call):
    torch_adapter.install("cpu")
    t = torch.ones(1, device="cuda")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(torch.AcceleratorError) as info:
        with torch.cuda.graph(g):
            bad(t * 2)
    from torch_adapter.redirect.cuda_graphs import GraphCaptureError

    assert isinstance(info.value, GraphCaptureError)
    text = str(info.value)
    assert text.startswith(call) and "not permitted when stream is capturing" in text
    assert "emulated on cpu" in text and "Fix: " in text
    assert not torch.cuda.is_current_stream_capturing()  # the capture ended with the error
    with pytest.raises(RuntimeError, match="a capture that failed"):
        g.replay()
    bad(t)  # outside a capture all of it is fine


def test_capture_and_replay_are_in_the_redirect_log_at_the_users_line():
    torch_adapter.install("cpu")
    x = torch.zeros(2, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x + 1
    for _ in range(2):
        g.replay()
    rows = {e.asked: e for e in torch_adapter.redirect_log().entries() if e.kind == "graph"}
    assert rows["torch.cuda.graph capture"].file == __file__
    assert "emulated on cpu: 1 ops recorded" in rows["torch.cuda.graph capture"].became
    assert rows["torch.cuda.CUDAGraph.replay()"].count == 2 and rows["torch.cuda.CUDAGraph.replay()"].file == __file__
    assert torch.equal(y, torch.ones(2))


def test_run_report_says_graphs_were_emulated_and_where(tmp_path):
    script = tmp_path / "graphed.py"
    script.write_text(
        "import torch\n"
        "x = torch.zeros(4, device='cuda')\n"
        "g = torch.cuda.CUDAGraph()\n"
        "with torch.cuda.graph(g):\n"
        "    y = torch.mm(x.view(2, 2), x.view(2, 2))\n"
        "x.fill_(1.0)\n"
        "g.replay()\n"
        "assert y.tolist() == [[2.0, 2.0], [2.0, 2.0]], y\n")
    res = run_cli("run", "--report", "full", str(script))
    assert res.returncode == 0, res.stderr
    err = " ".join(res.stderr.split())
    assert "graphed.py:4" in err and "torch.cuda.graph capture" in err and "emulated on cpu" in err
    assert "graphed.py:7" in err and "torch.cuda.CUDAGraph.replay()" in err
    assert "aten::mm" in err  # the replayed op is routed and counted like any other (the full tables)
    short = run_cli("run", "--report", str(script))  # the one-screen report names the capture and the replay
    assert short.returncode == 0, short.stderr
    assert "graphed.py:4: torch.cuda.graph capture" in short.stderr and "graphed.py:7: torch.cuda.CUDAGraph.replay()" in short.stderr


def test_uninstall_restores_torch_graph_api_and_optimizers():
    import torch.optim.adam as adam

    before = (torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.make_graphed_callables,
              adam._get_capturable_supported_devices)
    torch_adapter.install("cpu")
    assert "cpu" in adam._get_capturable_supported_devices()
    torch_adapter.uninstall()
    assert (torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.make_graphed_callables,
            adam._get_capturable_supported_devices) == before
    assert "cpu" not in adam._get_capturable_supported_devices()
