"""A failure class the real-program acceptance run found (benchmarks/realworld): float16 weights
under ``autocast("cuda", float16)``.

diffusers' train_text_to_image.py casts the frozen text encoder to float16 (``--mixed_precision
fp16``) and saves it so; a CUDA user reloads the pipeline and samples under
``autocast("cuda", float16)``. On CUDA that works: CUDA autocast runs layer_norm, group_norm and
rms_norm in float32, weights included, and batch_norm in its input's (the user's float16) dtype.
Under the adapter on the CPU the AMP policy then made the autocast bfloat16, and CPU autocast
has no rule for these ops, so a Linear's bfloat16 output met a LayerNorm whose weights are float16:
"mixed dtype (CPU)". Once CUDA autocast was redirected, the adapter applies CUDA's rules to these
ops in the target's autocast regions (also torch.utils.checkpoint's recomputation, which re-enters
``autocast("cpu")``); before install and after uninstall, plain torch. The ops CPU autocast
*promotes* (``cat``, ``stack``, ...) refuse a float16/bfloat16 mix outright, which no per-op rule
can fix: the reloaded float16 pipeline failed there, so the default policy ("auto") now keeps
the program's float16 (redirect/amp.py); ``amp_dtype="bfloat16"`` still rewrites.
"""

from __future__ import annotations

import pytest
import torch

import torch_adapter

# bfloat16 has 8 significant bits: one rounding of a unit-scale value is ~4e-3; a Linear of 8
# inputs adds a few such roundings.
AMP_TOL = dict(rtol=2e-2, atol=3e-2)
# These are CUDA autocast's float16 rules: float16 as asked on every CPU kind. Under the default
# dtype policy (auto) a CPU without bf16 units runs autocast('cuda', float16) disabled, with float32
# tensors (tests/test_dtype_policy.py), where none of these rules is reached.
F16 = dict(dtype_policy="float16")


def _ln_block() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8, elementwise_affine=True))
    with torch.no_grad():  # non-trivial affine parameters, so that casting them matters
        block[1].weight.uniform_(0.5, 1.5)
        block[1].bias.uniform_(-0.5, 0.5)
    return block, torch.randn(4, 8)


def _gn_block() -> tuple[torch.nn.Module, torch.Tensor]:
    """A diffusers ResnetBlock2D's head: GroupNorm -> SiLU -> Conv2d -> GroupNorm."""
    torch.manual_seed(1)
    block = torch.nn.Sequential(torch.nn.GroupNorm(4, 8), torch.nn.SiLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
                                torch.nn.GroupNorm(4, 8))
    with torch.no_grad():
        for gn in (block[0], block[3]):
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
    return block, torch.randn(2, 8, 6, 6)


def _under_cuda_autocast(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What a CUDA program does: a float16 model on "cuda", sampled under autocast."""
    block = block.cuda().half()
    with torch.autocast("cuda", dtype=torch.float16), torch.no_grad():
        return block(x.cuda().half())


def _float32_reference(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The same float16-rounded weights and input, computed in float32 without autocast."""
    block = block.half().float()
    with torch.no_grad():
        return block(x.half().float())


@pytest.mark.parametrize("policy", ["auto", "bfloat16", "float16"])
@pytest.mark.parametrize("make", [_ln_block, _gn_block], ids=["layer_norm", "group_norm"])
def test_float16_weights_under_cuda_autocast_match_the_float32_reference(policy, make):
    block, x = make()
    reference = _float32_reference(*make())
    with torch_adapter.adapted("cpu", amp_dtype=policy):
        y = _under_cuda_autocast(block, x)
    assert y.dtype == torch.float32  # CUDA autocast's answer for a norm op: float32
    torch.testing.assert_close(y, reference, **AMP_TOL)


def test_rms_norm_with_float16_weights_runs_in_float32_as_on_cuda():
    torch.manual_seed(2)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))
    x = torch.randn(4, 8)
    reference = _float32_reference(block, x)
    with torch_adapter.adapted("cpu", **F16):
        y = _under_cuda_autocast(block, x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, reference, **AMP_TOL)


@pytest.mark.parametrize("norm", [lambda: torch.nn.BatchNorm2d(8),
                                  lambda: torch.nn.InstanceNorm2d(8, affine=True, track_running_stats=True)],
                         ids=["batch_norm", "instance_norm"])
def test_batch_norm_with_float16_weights_runs_in_their_dtype_and_updates_its_stats(norm):
    """CUDA autocast has no rule for batch_norm: it runs in the input's dtype, the user's float16.
    Under the bfloat16 rewrite the input is cast to the weights' dtype; the running statistics
    (updated in place in training mode) stay the user's float16 buffers."""
    torch.manual_seed(3)
    conv, bn = torch.nn.Conv2d(8, 8, 1).half(), norm().half()
    x = torch.randn(2, 8, 5, 5, dtype=torch.float16)
    stats = bn.running_mean
    with torch_adapter.adapted("cpu", amp_dtype="bfloat16", **F16):
        with torch.autocast("cuda", dtype=torch.float16):
            h = conv(x)
            y = bn(h)
    assert h.dtype == torch.bfloat16 and y.dtype == torch.float16
    assert bn.running_mean is stats and stats.dtype == torch.float16 and stats.abs().sum() > 0
    # unit affine parameters: the normalised input, over (N, H, W) per channel or (H, W) per instance
    dims = (2, 3) if isinstance(bn, torch.nn.InstanceNorm2d) else (0, 2, 3)
    h32 = h.float()
    reference = (h32 - h32.mean(dims, keepdim=True)) / (h32.var(dims, unbiased=False, keepdim=True) + bn.eps).sqrt()
    torch.testing.assert_close(y.float(), reference, **AMP_TOL)


def test_training_through_a_float32_layer_norm_under_cuda_autocast_gives_float32_grads():
    block, x = _ln_block()
    ref_block, _ = _ln_block()
    ref_block(x).square().mean().backward()
    with torch_adapter.adapted("cpu", **F16):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = block(x).square().mean()
        loss.backward()
    for p, ref in zip(block.parameters(), ref_block.parameters()):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, ref.grad, **AMP_TOL)


def _plain_cpu_autocast_outcomes() -> list[object]:
    """Plain ``autocast("cpu", bfloat16)`` on the blocks: each result, or the error's text."""
    outcomes: list[object] = []
    for make, half in ((_ln_block, True), (_gn_block, True), (_ln_block, False), (_gn_block, False)):
        block, x = make()
        if half:
            block, x = block.half(), x.half()
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
                outcomes.append(block(x))
        except RuntimeError as e:
            outcomes.append(str(e))
    return outcomes


def _assert_same_outcomes(got: list[object], want: list[object]) -> None:
    for g, w in zip(got, want, strict=True):
        if isinstance(w, str):
            assert g == w
        else:
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_uninstall_restores_plain_cpu_autocast_behaviour():
    before = _plain_cpu_autocast_outcomes()
    assert "mixed dtype" in before[0] and "mixed dtype" in before[1]  # plain CPU autocast's own answer
    with torch_adapter.adapted("cpu", **F16):
        _under_cuda_autocast(*_ln_block())  # a redirected region registers the norm rules
        during = _plain_cpu_autocast_outcomes()  # ...which then hold in every CPU autocast region
        assert all(isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in during[:2])
    _assert_same_outcomes(_plain_cpu_autocast_outcomes(), before)
    for op in ("layer_norm", "group_norm", "batch_norm"):  # and no kernel of the session is left behind
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "AutocastCPU")
    with torch_adapter.adapted("cpu", **F16):  # a second session registers them again
        assert _under_cuda_autocast(*_ln_block()).dtype == torch.float32
    _assert_same_outcomes(_plain_cpu_autocast_outcomes(), before)


def test_a_checkpointed_block_recomputes_with_the_dtypes_of_its_forward():
    """torch.utils.checkpoint re-enters autocast as autocast("cpu") during backward: the norm
    rules must hold there too, or the recomputed tensors' dtypes differ from the saved ones
    (a CheckpointError, as diffusers' --gradient_checkpointing met)."""
    from torch.utils.checkpoint import checkpoint

    block, x = _ln_block()
    with torch_adapter.adapted("cpu", **F16):
        block = block.cuda()
        x = x.cuda().requires_grad_()
        with torch.autocast("cuda", dtype=torch.float16):
            out = checkpoint(block, x, use_reentrant=False)
        out.float().sum().backward()
        assert out.dtype == torch.float32 and x.grad is not None


def test_the_rules_hold_in_a_compiled_region():
    """torch.compile traces the autocast region (dynamo re-creates it in the graph): the norm rules
    are traced with it (aot_eager: the traced graph, run by eager kernels)."""
    block, x = _ln_block()
    block, x = block.half(), x.half()
    with torch_adapter.adapted("cpu", **F16):
        with torch.autocast("cuda", dtype=torch.float16), torch.no_grad():
            eager = block(x)

        def f(x):
            with torch.autocast("cuda", dtype=torch.float16):
                return block(x)

        torch._dynamo.reset()
        try:
            with torch.no_grad():
                compiled = torch.compile(f, backend="aot_eager")(x)
        finally:
            torch._dynamo.reset()
    assert eager.dtype == compiled.dtype == torch.float32
    torch.testing.assert_close(compiled, eager)


def _promoting_step(lin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What a float16 pipeline does: an autocast op's output joined with a float16 tensor that
    no autocast op made (a timestep embedding, a cached key), by an op CPU autocast promotes."""
    with torch.autocast("cuda", dtype=torch.float16), torch.no_grad():
        return torch.cat([lin(x), x * 2])


def test_float16_weights_meet_promoting_ops_under_the_default_policy():
    torch.manual_seed(4)
    lin, x = torch.nn.Linear(4, 4).half(), torch.randn(2, 4, dtype=torch.float16)
    with torch_adapter.adapted("cpu", **F16) as session:  # amp_dtype="auto"
        y = _promoting_step(lin, x)
        rows = [e.became for e in session.redirect_log.entries() if e.kind == "amp"]
    assert y.dtype == torch.float16 and rows and "autocast('cpu', float16)" in rows[0]
    with torch.no_grad():
        reference = torch.cat([lin.float()(x.float()), x.float() * 2])
    torch.testing.assert_close(y.float(), reference, rtol=2e-3, atol=2e-3)


def test_the_bfloat16_policy_still_rewrites_and_says_why_float16_weights_fail():
    lin, x = torch.nn.Linear(4, 4).half(), torch.randn(2, 4, dtype=torch.float16)
    with torch_adapter.adapted("cpu", amp_dtype="bfloat16", **F16):
        with pytest.raises(RuntimeError, match="prioritize"):  # CPU autocast's own refusal
            _promoting_step(lin, x)


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
