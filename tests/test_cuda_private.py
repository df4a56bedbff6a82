"""What PyTorch's own CUDA test machinery reaches past ``torch.cuda`` for, answered while installed:
the private ``torch._C._cuda_*`` stream/device bindings (``CudaNonDefaultStream`` runs every CUDA
test on a new stream through them) and every name of the real ``torch.cuda`` submodules
(``common_methods_invocations`` builds jiterator OpInfos at import)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest
import torch

import torch_adapter
from torch_adapter.errors import UnsupportedCudaFeature
from torch_adapter.redirect import cuda_bindings


def _cuda_submodules() -> dict[str, set[str]]:
    """Each real ``torch.cuda.<sub>`` module and its public names (read with no adapter)."""
    out = {}
    for name in dir(torch.cuda):
        value = getattr(torch.cuda, name)
        if isinstance(value, types.ModuleType) and value.__name__.startswith("torch.cuda."):
            out[name] = {n for n in dir(value) if not n.startswith("_")}
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the bindings are torch's own on a CUDA build")
def test_non_default_stream_of_the_cuda_test_base_runs():
    from torch.testing._internal.common_utils import CudaNonDefaultStream

    assert not hasattr(torch._C, "_cuda_setStream")  # what the whole CUDA suite failed on
    torch_adapter.install("cpu")
    with CudaNonDefaultStream():
        assert torch._C._cuda_getCurrentStream(0) == (0, 0, 0)
        assert torch._C._cuda_getDevice() == torch.cuda.current_device() == 0
    assert torch._C._cuda_exchangeDevice(0) == 0
    assert torch._C._cuda_cudaCachingAllocator_is_enabled() is False
    torch_adapter.uninstall()
    assert not any(hasattr(torch._C, n) for n in cuda_bindings.BINDINGS)


def test_the_compiled_marker_is_not_answered():
    """``torch.cuda._is_compiled()`` tests ``_cuda_getDeviceCount``: it must stay False on a CPU build."""
    compiled = torch.cuda._is_compiled()
    with torch_adapter.adapted("cpu"):
        assert torch.cuda._is_compiled() == compiled
        assert "_cuda_getDeviceCount" not in cuda_bindings.BINDINGS


def test_every_submodule_name_is_still_there():
    real = _cuda_submodules()
    assert {"jiterator", "graphs", "nvtx", "memory", "random", "streams", "amp"} <= set(real)
    with torch_adapter.adapted("cpu"):
        for sub, names in real.items():
            mod = getattr(torch.cuda, sub)
            assert inspect.ismodule(mod), f"torch.cuda.{sub} replaced by {type(mod).__name__}"
            missing = sorted(n for n in names if not hasattr(mod, n))
            assert not missing, f"torch.cuda.{sub} lacks {missing}"


def test_jiterator_builds_and_raises_when_called():
    with torch_adapter.adapted("cpu"):
        assert hasattr(torch.cuda.jiterator._create_jit_fn, "__torch_adapter_original__")  # a stand-in now
        fn = torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x) { return x; }")
        multi = torch.cuda.jiterator._create_multi_output_jit_fn("template <typename T> T f(T x) { return x; }", 2)
        for f in (fn, multi):
            with pytest.raises(UnsupportedCudaFeature, match="jiterator"):
                f(torch.ones(2, device="cuda"))
    assert not hasattr(torch.cuda.jiterator._create_jit_fn, "__torch_adapter_original__")  # the stand-in mark


def test_common_methods_invocations_imports_under_the_adapter():
    code = ("import torch_adapter; torch_adapter.install('cpu')\n"
            "import torch.testing._internal.common_methods_invocations as cmi\n"
            "print(len(cmi.op_db) > 100)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"
