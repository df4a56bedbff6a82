"""uninstall() puts back every patched attribute — the identical object — and the env."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.distributed.device_mesh
import torch.nn.attention
import torch.serialization
import torch.utils._device
import torch.utils.data
from torch.amp import autocast_mode, grad_scaler
from torch.autograd import profiler as autograd_profiler
from torch.nn.parallel import data_parallel
from torch.profiler import profiler as profiler_mod

import safetensors
import safetensors.torch

import torch_adapter

NAMESPACES = {
    "torch": torch,
    "torch.cuda": torch.cuda,
    **{f"torch.cuda.{n}": getattr(torch.cuda, n) for n in ("memory", "random", "graphs", "streams", "nvtx", "amp",
                                                            "profiler")},
    "torch.Tensor": torch.Tensor,
    "torch.nn.Module": torch.nn.Module,
    "torch.distributed": dist,
    "distributed_c10d": dist.distributed_c10d,
    "device_mesh": torch.distributed.device_mesh,
    "torch.serialization": torch.serialization,
    "torch.amp": torch.amp,
    "autocast_mode": autocast_mode,
    "autocast": autocast_mode.autocast,
    "GradScaler": grad_scaler.GradScaler,
    "DeviceContext": torch.utils._device.DeviceContext,
    "DataLoader": torch.utils.data.DataLoader,
    "DDP": torch.nn.parallel.DistributedDataParallel,
    "data_parallel": data_parallel,
    "torch.nn.parallel": torch.nn.parallel,
    "torch.nn.parallel.data_parallel (module)": sys.modules["torch.nn.parallel.data_parallel"],
    "torch.nn.attention": torch.nn.attention,
    "profile": profiler_mod.profile,
    "autograd.profile": autograd_profiler.profile,
    "UntypedStorage": torch.UntypedStorage,
    "TypedStorage": torch.TypedStorage,
    "safetensors": safetensors,
    "safetensors.torch": safetensors.torch,
}


def snapshot() -> dict[str, dict[str, object]]:
    return {label: dict(vars(ns)) for label, ns in NAMESPACES.items()}


def assert_identical(before, after):
    for label, names in before.items():
        now = after[label]
        changed = [n for n, obj in names.items() if n not in now or now[n] is not obj]
        assert not changed, f"{label}: not restored: {changed[:10]}"
        added = [n for n in now if n not in names and not isinstance(now[n], types.ModuleType)]
        assert not added, f"{label}: left behind: {added[:10]}"


@pytest.mark.parametrize("target,simulate", [("cpu", False), ("auto", False)])
def test_uninstall_restores_identical_objects(target, simulate):
    env_before = dict(os.environ)
    before = snapshot()
    inherited_to = torch.Tensor.to
    session = torch_adapter.install(target, simulate=simulate, propagate=True)
    assert len(session.patcher) > 100
    assert torch.Tensor.to is not inherited_to
    assert torch.cuda.is_available()
    torch_adapter.uninstall()
    assert_identical(before, snapshot())
    assert torch.Tensor.to is inherited_to  # inherited from TensorBase again
    assert dict(os.environ) == env_before
    assert not torch.cuda.is_available()


def test_install_twice_is_harmless():
    before = snapshot()
    s1 = torch_adapter.install("cpu")
    n = len(s1.patcher)
    s2 = torch_adapter.install("cpu")
    assert s1 is s2 and len(s2.patcher) == n
    torch_adapter.uninstall()
    torch_adapter.uninstall()  # twice: harmless
    assert_identical(before, snapshot())


def test_install_with_other_settings_replaces_the_session():
    before = snapshot()
    s1 = torch_adapter.install("cpu")
    s2 = torch_adapter.install("cpu", amp_dtype="float16")
    assert s1 is not s2 and not s1.active and s2.active
    torch_adapter.uninstall()
    assert_identical(before, snapshot())


def test_adapted_scopes_and_restores_the_previous_session():
    before = snapshot()
    with torch_adapter.adapted(target="cpu") as s:
        assert torch.zeros(1, device="cuda").device.type == "cpu"
        assert torch_adapter.current() is s
    assert torch_adapter.current() is None
    assert_identical(before, snapshot())
    outer = torch_adapter.install("cpu", amp_dtype="bfloat16")
    with torch_adapter.adapted(target="cpu", amp_dtype="float32"):
        assert torch_adapter.current().config.amp_dtype == "float32"
    assert torch_adapter.current().config.amp_dtype == "bfloat16"
    assert torch_adapter.current().target == outer.target


def test_adapted_restores_after_an_exception():
    before = snapshot()
    with pytest.raises(ZeroDivisionError):
        with torch_adapter.adapted(target="cpu"):
            1 / 0
    assert_identical(before, snapshot())
