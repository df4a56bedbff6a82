"""The "no fallback" gate (issue 36, item 4): a budget of CPU fallbacks in configure(), and
``torch-adapter run --max-fallbacks N --deny CODE --baseline routing.json`` failing a run that exceeds
what a team allows — on real runs of a small CUDA-written script on the simulated MPS target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_adapter
from torch_adapter.errors import FallbackError, UsageError


def test_a_fallback_budget_raises_at_the_first_op_past_it():
    x = torch.randn(8, 4)
    with torch_adapter.adapted("mps", simulate=True, max_fallbacks=1):
        torch.pdist(x.cuda())  # the one allowed
        torch.pdist(x.cuda())  # the same op again: still one
        with pytest.raises(FallbackError) as err:
            torch.linalg.eigh((x.T @ x).cuda())
    text = str(err.value)
    assert "at most 1 distinct ops on the CPU" in text and "already: aten::_pdist_forward" in text
    assert "TA-F001" in text and "configure(max_fallbacks=2)" in text
    with torch_adapter.adapted("mps", simulate=True, max_fallbacks=0, allow=["aten::_pdist_forward"]):
        torch.pdist(x.cuda())  # allowed ops are outside the budget
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(UsageError, match="max_fallbacks"):
            torch_adapter.install(target="mps", simulate=True, max_fallbacks=bad)
        assert torch_adapter.current() is None
