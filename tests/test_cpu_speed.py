"""The one-off bfloat16-vs-float32 check (core/cpu_speed.py): where the flags choose bfloat16 for
float16 work, a CPU whose bfloat16 kernels are not faster keeps float32 — measured once per machine,
kept in the start-up cache, read back by later processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torch_adapter.core import cpu_speed, disk_cache
from torch_adapter.core.cpu_features import forced
from torch_adapter.routing.low_precision import compute_dtype


def test_the_verdict_is_the_geometric_mean_against_the_margin():
    fp32 = {"mm_512": 1.0, "conv3x3_64ch_32px": 2.0}
    fast = cpu_speed.decide(fp32, {"mm_512": 0.25, "conv3x3_64ch_32px": 0.8}, 1, "measured")
    assert fast.faster and fast.ratio == pytest.approx((0.25 * 0.4) ** 0.5, abs=1e-4)
    slow = cpu_speed.decide(fp32, {"mm_512": 1.3, "conv3x3_64ch_32px": 1.6}, 1, "measured")
    assert not slow.faster and slow.ratio > 1
    even = cpu_speed.decide(fp32, {"mm_512": 0.95, "conv3x3_64ch_32px": 1.9}, 1, "measured")
    assert not even.faster  # within MARGIN: float32, closer to float16's numerics
    assert "a 512² mm 1.30 vs 1.00 ms" in slow.text() and "1 thread)" in slow.text()
    assert fast.attention_ratio is None and fast.attention_faster is None  # not timed: the flags decide


def test_attention_has_its_own_verdict_apart_from_the_products():
    """The avx512_bf16 EPYC's shape: bfloat16 products 3-6x faster, bfloat16 attention slower."""
    fp32 = {"mm_512": 1.35, "conv3x3_64ch_32px": 0.25, cpu_speed.ATTENTION: 0.25}
    s = cpu_speed.decide(fp32, {"mm_512": 0.31, "conv3x3_64ch_32px": 0.16, cpu_speed.ATTENTION: 0.28}, 2, "measured")
    assert s.faster and s.ratio == pytest.approx((0.31 / 1.35 * 0.16 / 0.25) ** 0.5, abs=1e-4)
    assert s.attention_faster is False and s.attention_ratio == pytest.approx(0.28 / 0.25, abs=1e-4)
    assert "attention" not in s.text() and s.text("attention").startswith("attention (4 heads, 256 tokens")
    amx = cpu_speed.decide(fp32, {"mm_512": 0.1, "conv3x3_64ch_32px": 0.1, cpu_speed.ATTENTION: 0.1}, 1, "measured")
    assert amx.attention_faster is True


def _store(key: dict, bf16_attention: float) -> None:
    assert disk_cache.store("speed", key, {
        "float32_ms": {"mm_512": 1.35, "conv3x3_64ch_32px": 0.25, cpu_speed.ATTENTION: 0.25},
        "bfloat16_ms": {"mm_512": 0.31, "conv3x3_64ch_32px": 0.16, cpu_speed.ATTENTION: bf16_attention},
        "threads": key["threads"]}, plain=True)


@pytest.mark.parametrize("bf16_attention, expected", [(0.28, "float32"), (0.05, "bfloat16")])
def test_the_measured_attention_verdict_decides_either_way(bf16_attention, expected, tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(disk_cache.ENV_SWITCH, "on")
    monkeypatch.delenv(cpu_speed.ENV, raising=False)
    monkeypatch.setattr(cpu_speed, "_KNOWN", {})
    monkeypatch.setenv("TORCH_ADAPTER_CPU_FEATURES", "avx512_bf16")  # the variable, not forced(): measured
    _store(cpu_speed._key(), bf16_attention)
    name, why = cpu_speed.attention_compute()
    assert name == expected, why
    assert cpu_speed.float16_compute()[0] == "bfloat16"  # the products' verdict is its own
    assert ("measured no faster" in why) == (expected == "float32") and "attention (4 heads" in why
    monkeypatch.setenv(cpu_speed.ENV, "off")  # no check: the flags (no AMX tiles: float32)
    assert cpu_speed.attention_compute()[0] == "float32"
    monkeypatch.setenv("TORCH_ADAPTER_CPU_FEATURES", "amx")
    assert cpu_speed.attention_compute()[0] == "bfloat16"
    monkeypatch.setenv("TORCH_ADAPTER_CPU_FEATURES", "avx2")
    assert cpu_speed.attention_compute()[0] == "float32"


def test_an_entry_without_the_attention_verdict_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(disk_cache.ENV_SWITCH, "on")
    monkeypatch.delenv(cpu_speed.ENV, raising=False)
    monkeypatch.setattr(cpu_speed, "_KNOWN", {})
    key = cpu_speed._key()
    assert disk_cache.store("speed", key, {"float32_ms": {"mm_512": 1.0}, "bfloat16_ms": {"mm_512": 0.2},
                                           "threads": key["threads"]}, plain=True)
    speed = cpu_speed.bfloat16_speed()
    assert speed.source == "measured" and speed.attention_ratio is not None


_CHILD = """
import json, torch
from torch_adapter.core import cpu_speed
from torch_adapter.routing.low_precision import compute_dtype
torch.manual_seed(0)
s = cpu_speed.bfloat16_speed()
dtype, why = compute_dtype("auto")
print(json.dumps({"source": s and s.source, "faster": s and s.faster, "dtype": str(dtype), "why": why,
                  "rng": torch.randn(1).item()}))
"""


def _child(tmp_path, **env: str) -> dict:
    full = {**os.environ, disk_cache.ENV_DIR: str(tmp_path), disk_cache.ENV_SWITCH: "on",
            "TORCH_ADAPTER_CPU_FEATURES": "avx512_bf16"}
    full.pop(cpu_speed.ENV, None)
    full.update(env)
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, env=full)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_measured_once_then_read_back_keyed_by_what_caps_the_kernels(tmp_path):
    first = _child(tmp_path)
    assert first["source"] == "measured"
    assert first["dtype"] == ("torch.bfloat16" if first["faster"] else "torch.float32")
    assert ("measured no faster" in first["why"]) == (not first["faster"])
    again = _child(tmp_path)
    assert again["source"] == "cache" and again["faster"] == first["faster"]
    assert again["rng"] == first["rng"]  # the program's random stream is not touched by the check
    assert len(list(tmp_path.glob("speed-*.json"))) == 1
    capped = _child(tmp_path, ATEN_CPU_CAPABILITY="avx2")  # other kernels: its own entry, measured
    assert capped["source"] == "measured" and len(list(tmp_path.glob("speed-*.json"))) == 2
    off = _child(tmp_path, TORCH_ADAPTER_SPEED_CHECK="off")
    assert off["source"] is None and off["dtype"] == "torch.bfloat16"  # the flags alone


def test_a_cpu_whose_bfloat16_is_slower_keeps_float32_with_the_reason(tmp_path, monkeypatch):
    """The verdict a slow-bf16 machine measured (stored as the check stores it) decides the session."""
    monkeypatch.setenv(disk_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(disk_cache.ENV_SWITCH, "on")  # (the suite runs with the start-up cache off)
    monkeypatch.delenv(cpu_speed.ENV, raising=False)
    monkeypatch.setattr(cpu_speed, "_KNOWN", {})
    key = cpu_speed._key()
    assert disk_cache.store("speed", key, {"float32_ms": {"mm_512": 0.32, "conv3x3_64ch_32px": 0.62,
                                                          cpu_speed.ATTENTION: 0.5},
                                           "bfloat16_ms": {"mm_512": 0.41, "conv3x3_64ch_32px": 0.98,
                                                           cpu_speed.ATTENTION: 0.6},
                                           "threads": key["threads"]}, plain=True)
    monkeypatch.setenv("TORCH_ADAPTER_CPU_FEATURES", "avx512_bf16")
    dtype, why = compute_dtype("auto")
    assert str(dtype) == "torch.float32"
    assert "bfloat16 kernels measured no faster than float32 here (a 512² mm 0.41 vs 0.32 ms" in why, why
    with forced("avx512_bf16"):  # a forced kind: its table alone (what the tests of each kind rely on)
        assert str(compute_dtype("auto")[0]) == "torch.bfloat16"
    (path,) = tmp_path.glob("speed-*.json")
    path.write_text("{not json")  # a corrupt entry: measured again and rewritten
    monkeypatch.setattr(cpu_speed, "_KNOWN", {})
    assert cpu_speed.bfloat16_speed().source == "measured"
    assert json.loads(path.read_text())["key"] == key


# CI runs this file a second time as a CPU without bf16 units (TORCH_ADAPTER_CPU_FEATURES=avx2): .ci/run
pytestmark = pytest.mark.cpu_kind


def test_a_bfloat16_kernel_that_raises_is_never_faster():
    """torch 2.13's CPU flash attention in bfloat16 raises 'pack_vnni2 is only supported when avx512 is
    supported' on an AMX CPU whose kernels are capped at AVX2 (ATEN_CPU_CAPABILITY=avx2): the check
    crashed the program (found on a Sapphire Rapids machine). A product whose bfloat16 kernel raises
    is recorded with torch's error and counts as never faster."""
    speed = cpu_speed.decide({"mm_512": 1.0, "conv3x3_64ch_32px": 1.0, cpu_speed.ATTENTION: 1.0},
                             {"mm_512": 0.3, "conv3x3_64ch_32px": 0.3, cpu_speed.ATTENTION: None}, 1, "measured",
                             {cpu_speed.ATTENTION: "pack_vnni2 is only supported when avx512 is supported"})
    assert speed.faster and speed.attention_faster is False and speed.attention_ratio == float("inf")
    assert "attention (4 heads, 256 tokens, 32 wide) in bfloat16 raised (pack_vnni2" in speed.text("attention")
    both = cpu_speed.decide({"mm_512": 1.0}, {"mm_512": None}, 1, "cache", {"mm_512": "boom"})
    assert not both.faster and "raised (boom)" in both.text()


_CAPPED = """
import json
from torch_adapter.core import cpu_speed
from torch_adapter.routing.internal import internal
s = cpu_speed.bfloat16_speed()
with internal():
    name, why = cpu_speed.attention_compute()
print(json.dumps({"errors": s.errors, "attention": name, "why": why}))
"""


def test_kernels_capped_at_avx2_on_this_cpu(tmp_path):
    """This machine's own flags, kernels capped at AVX2: the check finishes; where a bfloat16 kernel
    raised (AMX CPUs, torch's flash attention), float16 attention computes in float32 and says why."""
    env = {**os.environ, disk_cache.ENV_DIR: str(tmp_path), disk_cache.ENV_SWITCH: "on", "ATEN_CPU_CAPABILITY": "avx2"}
    env.pop(cpu_speed.ENV, None)
    env.pop("TORCH_ADAPTER_CPU_FEATURES", None)
    done = subprocess.run([sys.executable, "-c", _CAPPED], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    if cpu_speed.ATTENTION in r["errors"]:
        assert r["attention"] == "float32" and "raised" in r["why"], r
    (entry,) = tmp_path.glob("speed-*.json")
    stored = json.loads(entry.read_text())
    assert stored["data"]["bfloat16_errors"] == r["errors"]  # read back by later processes as measured
