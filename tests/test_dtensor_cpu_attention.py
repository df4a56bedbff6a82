"""Tensor-parallel attention written for CUDA runs on the CPU target (issue 16's acceptance run).

On CUDA, ``F.scaled_dot_product_attention`` on DTensors reaches the flash/efficient kernels,
which DTensor has sharding strategies for; on the CPU it reaches
``_scaled_dot_product_flash_attention_for_cpu``, which torch 2.13's DTensor has none for
(pytorch/examples' ``fsdp_tp_example.py`` stopped with "does not have a sharding strategy
registered"). Real gloo process groups, fresh interpreters.
"""

from __future__ import annotations

import subprocess
import textwrap


from conftest import run_cli

TP_ATTENTION = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard, Replicate
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    torch.manual_seed(0)
    full = torch.randn(2, 4, 8, 16, device="cuda", requires_grad=True)
    ref = F.scaled_dot_product_attention(full, full, full, is_causal=True)
    ref.sum().backward()
    for spec in ([Shard(1)], [Shard(0)], [Replicate()]):      # heads (tensor parallel), batch, replicated
        x = distribute_tensor(full.detach(), mesh, spec).requires_grad_()
        out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        out.sum().backward()
        assert out.placements == tuple(spec), (out.placements, spec)
        assert torch.allclose(out.full_tensor(), ref, atol=1e-5), spec
        assert torch.allclose(x.grad.full_tensor(), full.grad, atol=1e-5), spec
    sys.stdout.write(f"rank {dist.get_rank()} sharded attention matches\\n")
    dist.destroy_process_group()
""")


def test_tensor_parallel_attention_matches_unsharded_under_torchrun(tmp_path):
    (tmp_path / "tp.py").write_text(TP_ATTENTION)
    res = run_cli("run", "torchrun", "--standalone", "--nproc-per-node", "2", str(tmp_path / "tp.py"),
                  cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} sharded attention matches" in res.stdout


REVERSIBLE = textwrap.dedent("""
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard   # DTensor loaded before install
    import torch_adapter
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))

    def attention():
        x = distribute_tensor(torch.randn(1, 4, 8, 16), mesh, [Shard(1)])    # heads sharded, as TP does
        try:
            return F.scaled_dot_product_attention(x, x, x, is_causal=True).placements
        except NotImplementedError as exc:
            return "no strategy" if "sharding strategy" in str(exc) else repr(exc)

    seen = [f"plain {attention()}"]
    torch_adapter.install("cpu")
    seen.append(f"installed {attention()}")
    torch_adapter.uninstall()
    seen.append(f"after {attention()}")
    if dist.get_rank() == 0:
        print("\\n".join(seen), flush=True)
    dist.destroy_process_group()
""")


def test_rules_live_only_while_installed(tmp_path):
    """DTensor imported before install (the torchrun test above imports it while installed); torch's
    own behaviour before and after. Plain torchrun: the script installs and uninstalls itself."""
    (tmp_path / "rev.py").write_text(REVERSIBLE)
    res = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", "2", str(tmp_path / "rev.py")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stdout.splitlines() if line.split(" ", 1)[0] in ("plain", "installed", "after")]
    assert lines == ["plain no strategy", "installed (Shard(dim=1),)", "after no strategy"], res.stdout
