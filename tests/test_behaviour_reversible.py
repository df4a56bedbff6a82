"""uninstall() restores torch's *behaviour*, whatever order things were imported and first used in.

Each scenario runs tests/data/behaviour_probe.py in a fresh interpreter: a set of torch
behaviours (meta init, ``with torch.device``, ``set_default_device``, the device decorator,
factories, DataParallel on the host, autocast, ``torch.load(map_location=...)``, int
ordinals, accelerate's ``init_empty_weights``, a transformers model built under meta)
before ``install()``, while installed, and after ``uninstall()``. Before and after must be
equal; while installed, only the CUDA requests may differ, and they must land on the CPU.
Torch's caches are built before install in some scenarios and first built while installed
in others (the failure that broke every transformers model: issue 16).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent / "data" / "behaviour_probe.py"
SCENARIOS = ("plain", "cold", "libs_before", "libs_during")

# What the adapter is for: CUDA requests that fail on this CPU-only torch, answered on the CPU.
ADAPTED = {
    "DataParallel.cuda()": "DataParallel",
    "DataParallel.cuda() forward": None,  # the same number as the plain forward (checked below)
    "int ordinal .to(0)": "cpu",
    "cuda factory": "cpu",
    "cuda available": True,
    "autocast cuda mm": "float16 on the device",  # the dtype policy's answer on this CPU kind (below)
    "torch.device(0)": "cuda:0",  # the real C object; mapped to the CPU where it is used
}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    out = {}
    for scenario in SCENARIOS:
        proc = subprocess.run([sys.executable, str(PROBE), scenario], capture_output=True, text=True, timeout=300,
                              env=env)
        assert proc.returncode == 0, f"{scenario}:\n{proc.stderr[-3000:]}"
        out[scenario] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _reference(results: dict[str, dict]) -> dict:
    """What torch does without the adapter (libs keys from the scenario that imports them)."""
    return {**results["libs_before"]["before"], **results["plain"]["before"]}


def test_scenarios_cover_both_cache_orders(results):
    assert results["plain"]["cache built before install"] is True
    assert results["cold"]["cache built before install"] is False
    assert results["libs_during"]["cache built before install"] is False


def test_the_reference_is_torchs_own_behaviour(results):
    ref = _reference(results)
    assert ref["with meta: empty"] == "meta" and ref["default meta: zeros"] == "meta"
    assert ref["transformers under meta"] == "meta"
    assert ref["cuda factory"].startswith("error") and ref["int ordinal .to(0)"].startswith("error")
    assert ref["DataParallel.cuda()"].startswith("error")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_after_uninstall_torch_behaves_as_before(results, scenario):
    ref = _reference(results)
    after = results[scenario]["after"]
    diff = {k: (ref[k], v) for k, v in after.items() if ref[k] != v}
    assert not diff, f"{scenario}: behaviour changed after uninstall (before, after): {diff}"
    if "before" in results[scenario]:
        assert results[scenario]["before"] == after


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_while_installed_only_cuda_requests_change(results, scenario):
    ref = _reference(results)
    during = results[scenario]["during"]
    same = {k: (ref[k], v) for k, v in during.items() if k not in ADAPTED and ref[k] != v}
    assert not same, f"{scenario}: torch behaviour changed while installed (plain, installed): {same}"
    policy = results[scenario]["float16 on the device"]  # float16, or float32 on a CPU without bf16 units
    assert policy in ("torch.float16", "torch.float32")
    for key, expected in ADAPTED.items():
        if expected is not None:
            assert during[key] == (policy if expected == "float16 on the device" else expected), (scenario, key, during[key])
    assert during["DataParallel.cuda() forward"] == ref["DataParallel forward"]


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind
