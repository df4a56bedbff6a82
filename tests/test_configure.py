"""configure(): every tool option has a documented, tested effect, and an invalid value is a
UsageError that lists the valid ones."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter.tools import memory_server as _memory_server, tool_mode as _tool_mode, debug
from torch_adapter.core.torch_private import dispatch_mode_stack
from torch_adapter.errors import NumericsError, UsageError
from torch_adapter.optimization.prepare import PrepareWarning, plan, prepare
from torch_adapter.session import Config


@pytest.mark.parametrize(("option", "value", "pattern"), [
    ("optimization_level", "fast", r"optimization_level=...\): expected one of 'conservative', 'balanced', "
                                   r"'aggressive', got 'fast' \(str\)"),
    ("memory_strategy", "tiny", r"memory_strategy=...\): expected one of 'default', 'reuse', 'aggressive', 'low', "
                                r"got 'tiny'"),
    ("propagate", "no", r"propagate=...\): expected one of False, True, got 'no' \(str\)"),
    ("log_redirects", 1, r"log_redirects=...\): expected one of False, True, got 1 \(int\)"),
    ("fallback", "maybe", r"fallback=...\): expected one of 'allow', 'warn', 'error', got 'maybe'"),
    ("fusion_patterns", ["mlp_blocks"], r"fusion_patterns=...\): expected names among \['attention_blocks'\]"),
    ("fusion_patterns", 3, r"fusion_patterns=...\): expected a name or a list of names \(str\), got 3 \(int\)"),
    ("gradient_checkpointing", "yes", r"gradient_checkpointing=...\): expected one of False, True, got 'yes'"),
    ("activation_checkpointing", [3], r"activation_checkpointing=...\): expected True, False, or nn.Module classes"),
    ("communication_bucket_size", -1, r"communication_bucket_size=...\): expected None or a number of megabytes > 0"),
    ("communication_bucket_size", True, r"communication_bucket_size=...\): expected None or a number.*got True"),
    ("communication_backend", "hccl", r"(?s)communication_backend=...\): expected None or a backend available here: "
                                      r"gloo.*got 'hccl'.*Why: 'hccl' comes with torch_npu"),
    ("debug_mode", "yes", r"debug_mode=...\): expected one of False, True, 'raise', 'warn', 'compare', got 'yes'"),
    ("debug_mode", 1, r"debug_mode=...\): expected one of False, True.*got 1 \(int\)"),
    ("memory_server", "on", r"memory_server=...\): expected one of False, True, got 'on'"),
    ("mixed_precision", "fp8", r"(?s)mixed_precision=...\): expected one of 'fp16', 'bf16', 'fp32' or None, got "
                               r"'fp8'.*Why: it sets the AMP dtype policy"),
    ("communication_backend", "pigeon", r"(?s)communication_backend=...\): expected None or a backend available "
                                        r"here: .*gloo.*, got 'pigeon'"),
])
def test_invalid_values_list_the_valid_ones(option, value, pattern):
    torch_adapter.install(target="cpu")
    before = torch_adapter.current().config.as_dict()
    with pytest.raises(UsageError, match=pattern):
        torch_adapter.configure(**{option: value})
    assert torch_adapter.current().config.as_dict() == before  # a rejected configure() changes nothing
    with pytest.raises(UsageError, match=pattern):
        torch_adapter.install(target="cpu", **{option: value})


def test_mixed_precision_is_the_amp_dtype_policy():
    torch_adapter.install(target="cpu", dtype_policy="float16")  # the AMP policy alone, on every CPU kind
    a = torch.randn(4, 4, device="cuda")
    for value, amp, dtype in (("fp16", "float16", torch.float16), ("bf16", "bfloat16", torch.bfloat16),
                              ("fp32", "float32", torch.float32), (None, "auto", torch.float16)):
        cfg = torch_adapter.configure(mixed_precision=value)
        assert (cfg.amp_dtype, cfg.mixed_precision) == (amp, value)
        with torch.autocast("cuda", dtype=torch.float16):
            assert torch.mm(a, a).dtype == dtype, value
    assert "mixed_precision" not in Config().as_dict()  # one source of truth: amp_dtype
    with pytest.raises(UsageError, match=r"(?s)mixed_precision=...\): expected amp_dtype='bfloat16' or no amp_dtype.*"
                                         r"got amp_dtype='float16'.*Fix: pass only one of them"):
        torch_adapter.configure(mixed_precision="bf16", amp_dtype="float16")


def test_communication_backend_overrides_the_nccl_mapping(tmp_path):
    import torch.distributed as dist

    torch_adapter.install(target="cpu", communication_backend="gloo")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/a", rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
    torch_adapter.configure(communication_backend="GLOO")
    assert torch_adapter.current().config.communication_backend == "gloo"
    if dist.is_mpi_available():
        pytest.skip("this torch has MPI")
    # a backend this torch lacks is refused at configure time, not inside init_process_group
    with pytest.raises(UsageError, match=r"(?s)communication_backend=...\).*got 'MPI'.*torch built with MPI"):
        torch_adapter.configure(communication_backend="MPI")
    assert torch_adapter.current().config.communication_backend == "gloo"


def test_debug_mode_turns_the_checks_on_and_off():
    torch_adapter.install(target="cpu", debug_mode=True)
    with pytest.raises(NumericsError, match=r"^aten::log \(forward\)"):
        torch.log(torch.tensor([-1.0]))
    torch_adapter.configure(debug_mode="warn")
    with pytest.warns(debug.NumericsWarning, match=r"^aten::sqrt \(forward\)"):
        torch.sqrt(torch.tensor([-1.0]))
    torch_adapter.configure(debug_mode=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.log(torch.tensor([-2.0]))
    assert dispatch_mode_stack() == []
    torch_adapter.configure(debug_mode="compare")
    assert _tool_mode.enabled("nan_check") and _tool_mode.enabled("cpu_compare")
    torch_adapter.uninstall()
    assert dispatch_mode_stack() == [] and not _tool_mode.enabled("cpu_compare")


def test_debug_mode_compare_checks_the_simulated_routes():
    torch_adapter.install(target="mps", simulate=True, debug_mode="compare")
    torch_adapter.register_fallback("aten::heaviside", lambda x, values: x * 0 + 3)  # wrong on purpose
    with pytest.raises(NumericsError, match=r"(?s)^aten::heaviside \(forward\).*route yours"):
        torch.heaviside(torch.randn(3), torch.zeros(()))


def test_optimization_level_plans():
    """prepare() and the optimization layer read one table: a level means the same in both."""
    from torch_adapter.optimization.layer import plan_for
    from torch_adapter.optimization.levels import LEVELS

    assert [plan(name).compile for name in LEVELS] == [False, False, True]
    for name in LEVELS:
        with torch_adapter.adapted("cpu", optimization_level=name) as session:
            assert plan().compile == plan_for(session)["compile"] == LEVELS[name].compile
            fast = plan_for(session)["fused_optimizers"] or plan_for(session)["foreach_optimizers"]
            assert fast == LEVELS[name].fast_optimizers
    torch_adapter.install(target="cpu", optimization_level="aggressive", memory_strategy="low")
    p = plan()
    assert (p.compile, p.gradient_checkpointing) == (True, True)
    assert p.describe() == "turn on gradient checkpointing; torch.compile(model)"


def test_conservative_and_balanced_return_the_model_and_aggressive_compiles_it():
    model = nn.Linear(3, 3)
    assert prepare(model) is model  # no session: conservative
    torch_adapter.install(target="cpu", optimization_level="balanced")
    assert prepare(model) is model  # the layer applies balanced's parts as the model runs
    torch_adapter.install(target="cpu", optimization_level="aggressive")
    compiled = prepare(model)  # torch.compile is lazy: nothing compiles until the first call
    assert compiled is not model and compiled._orig_mod is model
    with pytest.raises(UsageError, match=r"prepare\(optimization_level=...\): expected one of 'conservative'"):
        prepare(model, optimization_level="max")


@pytest.mark.slow
@pytest.mark.parametrize("level", ["aggressive"])
def test_compiled_models_compute_the_same(level):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    torch_adapter.install(target="cpu", optimization_level=level)
    try:
        torch.testing.assert_close(prepare(model)(x), model(x))
    finally:
        torch.compiler.reset()


def test_memory_strategy_low_turns_on_gradient_checkpointing():
    from diffusers import UNet2DConditionModel

    def unet() -> UNet2DConditionModel:
        torch.manual_seed(0)
        return UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 32),
                                    layers_per_block=1, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                    attention_head_dim=8, norm_num_groups=8)

    def grads(model: nn.Module) -> list[torch.Tensor]:
        torch.manual_seed(1)
        x, text = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 16)
        model.train()
        model(x, 3, encoder_hidden_states=text).sample.square().mean().backward()
        return [p.grad for p in model.parameters()]

    torch_adapter.install(target="cpu", memory_strategy="low")
    plain, low = unet(), prepare(unet())
    assert low.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    torch.testing.assert_close(grads(low), grads(plain))  # recomputed in backward, same result
    with pytest.warns(PrepareWarning, match="Linear has no gradient-checkpointing switch"):
        prepare(nn.Linear(2, 2))


def test_memory_server_option_and_environment_variable(monkeypatch):
    torch_adapter.install(target="cpu", memory_server=True)
    path = _memory_server.socket_path(os.getpid())
    assert path.exists()
    torch_adapter.configure(memory_server=False)
    assert not path.exists()
    torch_adapter.uninstall()
    monkeypatch.setenv("TORCH_ADAPTER_MEMORY_SERVER", "1")
    assert torch_adapter.install(target="cpu").config.memory_server is True and path.exists()
    torch_adapter.uninstall()
    assert not path.exists()


def test_tool_options_travel_to_child_processes():
    session = torch_adapter.install(target="cpu", optimization_level="balanced", memory_strategy="low",
                                    mixed_precision="bf16", debug_mode="warn")
    settings = json.loads(json.dumps(session.settings()))
    assert {k: settings[k] for k in ("optimization_level", "memory_strategy", "amp_dtype", "debug_mode")} == \
        {"optimization_level": "balanced", "memory_strategy": "low", "amp_dtype": "bfloat16", "debug_mode": "warn"}
    torch_adapter.uninstall()
    assert torch_adapter.install(**settings).config.as_dict() == session.config.as_dict()


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
