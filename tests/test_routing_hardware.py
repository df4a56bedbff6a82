"""On a machine with CUDA: the simulated-cuda routes of each coverage model against what the
real CUDA dispatcher does (op calls of one training step, the same recorder on both sides).

Simulated: the step runs on this host's CPU under ``install("cuda", simulate=True)``; real: the
same factory builds the model and its inputs on the CUDA device (``torch.device("cuda")`` as
the default device) and the step runs without the adapter, recorded by ``trace()``. Agreement
is the share of op calls whose op name appears on both sides (min of the two counts per op,
over the larger total); it must be at least 99 % for every family, and every op that
disagrees is listed in the failure message and printed.
"""

from __future__ import annotations

import collections

import pytest
import torch

import torch_adapter
from torch_adapter.coverage import engine as cov_engine
from torch_adapter.coverage.factories import build
from torch_adapter.coverage.models import FAMILIES

pytestmark = [
    pytest.mark.hardware,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device: compares simulated-cuda routes with the real CUDA dispatcher"),
]


def _calls(log) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for r in log.records():
        if r.parent is None and r.calls > 0:
            counts[r.op] += r.calls
    return counts


def _step_counts(fam, device: str) -> collections.Counter:
    with torch.device(device):
        work = build(fam)
        optimizer = torch.optim.AdamW(work.model.parameters(), lr=1e-4, foreach=device == "cuda")
        cov_engine.training_step(work, optimizer)  # warm-up: optimizer state exists
        if device == "cpu":
            with torch_adapter.adapted("cuda", simulate=True):
                with torch_adapter.trace(use_observer=False) as log:
                    cov_engine.training_step(work, optimizer)
        else:
            with torch_adapter.trace(use_observer=False) as log:
                cov_engine.training_step(work, optimizer)
    return _calls(log)


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_simulated_cuda_matches_the_real_dispatcher(fam):
    if fam.name == "custom_op":
        pytest.skip("its torch.library op has a CPU kernel only: the plain step fails on real CUDA by construction")
    simulated = _step_counts(fam, "cpu")
    real = _step_counts(fam, "cuda")
    agree = sum(min(simulated[op], real[op]) for op in simulated.keys() | real.keys())
    total = max(sum(simulated.values()), sum(real.values()))
    diff = {op: (simulated[op], real[op]) for op in sorted(simulated.keys() | real.keys()) if simulated[op] != real[op]}
    share = 100.0 * agree / total
    print(f"{fam.name}: {share:.2f} % of {total} op calls agree; (simulated, real) where they differ: {diff}")
    assert share >= 99.0, f"{fam.name}: {share:.2f} % agree; differing ops (simulated, real calls): {diff}"
