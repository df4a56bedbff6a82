"""Storages under the adapter: ``torch.UntypedStorage(..., device="cuda")`` / ``torch.TypedStorage``
and ``Storage.cuda()`` (found by PyTorch's test_torch.py in the wide conformance run:
test_untyped_storage_meta / test_typed_storage_meta, test_storage_meta_errors)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_adapter

pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")


@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, torch.device("cuda", 0)])
def test_a_storage_made_on_cuda_is_on_the_target(device):
    """The constructor raised "torch.UntypedStorage(): Storage device not recognized: cuda"."""
    with torch_adapter.adapted("cpu") as session:
        for args in ([], [0], [100], [[1, 2, 3, 4, 5, 6]]):
            s = torch.UntypedStorage(*args, device=device)
            assert s.device == torch.device("cpu") and type(s) is torch.UntypedStorage
            t = torch.TypedStorage(*args, dtype=torch.float32, device=device)
            assert t.device == torch.device("cpu") and t.dtype is torch.float32
        assert torch.TypedStorage([1, 2, 3], dtype=torch.int64, device=device).tolist() == [1, 2, 3]
        assert any(e.asked.startswith("torch.UntypedStorage(device=") for e in session.redirect_log.entries())
    assert "__new__" not in torch.UntypedStorage.__dict__  # uninstalled: torch's constructor
    assert torch.UntypedStorage(3).size() == 3
    with pytest.raises((RuntimeError, AssertionError)):  # a CPU build refuses CUDA again
        torch.UntypedStorage(3, device="cuda")


def test_cuda_of_a_storage_on_the_target_is_itself_and_of_a_meta_storage_refuses_as_on_cuda():
    """.cuda() returned a meta storage unchanged (as if it were already on the device), where CUDA —
    and .cpu() — raise "Cannot copy out of meta tensor"."""
    with torch_adapter.adapted("cpu"):
        host = torch.UntypedStorage(4)
        assert host.cuda() is host
        typed = torch.TypedStorage([1.0, 2.0], dtype=torch.float32)
        moved = typed.cuda()
        assert moved.device.type == "cpu" and moved.tolist() == [1.0, 2.0] and moved.data_ptr() == typed.data_ptr()
        for meta in (torch.UntypedStorage(4, device="meta"), torch.TypedStorage([1, 2], dtype=torch.float32, device="meta")):
            with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
                meta.cuda()
            with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
                meta.cpu()


def test_storage_of_a_tensor_on_the_device_moves_with_cuda():
    with torch_adapter.adapted("cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.arange(4.0, device="cuda")
        s = x.untyped_storage()
        assert s.cuda() is s and s.device.type == "cpu"


def test_cuda_ipc_of_a_storage_refuses_as_cuda_does_for_a_storage_not_on_cuda():
    """No storage is CUDA's on the target: ``_share_cuda_`` answers CUDA's error for any other, not the
    CPU build's "CUDA is not available" (test_storage_meta_errors asserts it once is_available())."""
    with torch_adapter.adapted("cpu"):
        for s in (torch.UntypedStorage(4, device="meta"), torch.UntypedStorage(4, device="cuda")):
            with pytest.raises(RuntimeError, match="only available on CUDA"):
                s._share_cuda_()
    assert "_share_cuda_" not in torch.UntypedStorage.__dict__
