"""Capability profiles: the op table from native_functions.yaml, live profiles, TOML profiles."""

from __future__ import annotations

import subprocess
import sys

import pytest

import torch_adapter
from torch_adapter.errors import ProfileError, UsageError
from torch_adapter.routing import ops_table, profiles


def test_table_follows_structured_delegate_and_defaults_to_composite_implicit():
    table = ops_table.load_table()
    add = table["aten::add.Tensor"]  # its CPU/CUDA/MPS kernels belong to its delegate add.out
    assert {"CPU", "CUDA", "MPS"} <= add.keys and not add.composite_implicit
    assert table["aten::nonzero"].keys >= {"CPU", "CUDA", "MPS"}
    assert table["aten::linear"].composite_implicit  # no kernel of its own besides MPS/nested
    assert table["aten::einsum"].composite_implicit and not table["aten::einsum"].keys - {"CompositeImplicitAutograd"}
    assert table["aten::clone"].composite_explicit == "CompositeExplicitAutograd"
    assert table["aten::t"].view and not table["aten::t"].mutates
    assert table["aten::add_.Tensor"].mutates and table["aten::add_.Tensor"].tags == ("pointwise",)
    counts = ops_table.count_by_key()
    # docs/figures/README.md#ops-table: measured on torch 2.13 (CPU/CUDA +3: add.out's ufunc kernels)
    assert counts["MPS"] == 890 and counts["CUDA"] == 1268 and counts["XPU"] == 40


def test_table_is_parsed_once_and_not_at_import():
    code = ("import torch_adapter, torch_adapter.routing.decide, torch_adapter.routing.profiles, sys\n"
            "from torch_adapter.routing import ops_table\n"
            "print(ops_table.load_table.cache_info().currsize, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]
    ops_table.load_table()
    hits = ops_table.load_table.cache_info().hits
    ops_table.load_table()
    assert ops_table.load_table.cache_info().hits == hits + 1


def test_builtin_profiles():
    mps = profiles.load_profile("mps")
    assert (mps.name, mps.dispatch_key, mps.native_count, mps.complete) == ("mps", "MPS", 890, True)
    assert "native_functions.yaml" in mps.source
    assert mps.is_native("aten::nonzero") and not mps.is_native("aten::_linalg_eigh")
    mtia = profiles.load_profile("MTIA")
    assert not mtia.complete and "incomplete" in mtia.description
    xpu = profiles.load_profile("xpu")  # from Intel's op table (tests/test_routing_vendor.py)
    assert xpu.complete and xpu.listed and "torch-xpu-ops" in xpu.source
    assert {"cuda", "mps", "mtia", "npu", "xpu", "cpu"} == set(profiles.builtin_names())
    assert profiles.load_profile("mps") is mps  # cached


def test_live_profile_reads_the_dispatcher():
    cpu = profiles.live_profile("cpu", "CPU")
    assert cpu.live and "live dispatcher" in cpu.source
    assert cpu.is_native("aten::mm") and not cpu.is_native("aten::clone")  # clone: composite kernel
    assert 900 < cpu.native_count < 1500


def test_unknown_profile_name():
    with pytest.raises(UsageError, match=r"load_profile\('vulkan'\).*built-in profile"):
        profiles.load_profile("vulkan")


def _write(tmp_path, text, name="p.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_user_profile_with_base_globs_and_forced_fallbacks(tmp_path):
    path = _write(tmp_path, """
name = "my-npu"
base = "mps"
dispatch_key = "PrivateUse1"
description = "preview"
native = ["aten::_linalg_eigh*", "aten::heaviside"]
not_native = ["aten::nonzero"]
fallback = ["aten::mm"]
""")
    p = profiles.load_profile(path)
    assert (p.name, p.dispatch_key, p.base, p.source) == ("my-npu", "PrivateUse1", "mps", path)
    assert p.is_native("aten::_linalg_eigh") and p.is_native("aten::_linalg_eigh.eigenvalues")
    assert p.is_native("aten::heaviside.out") and not p.is_native("aten::nonzero")
    assert "aten::mm" in p.forced_fallback
    d = torch_adapter.explain("aten::mm", target=p)
    assert d.route is torch_adapter.Route.FALLBACK and path in d.reason


@pytest.mark.parametrize("text, match", [
    ('name = "x"\nnative = [1]', r"p\.toml', key 'native': expected a list of op names.*got \[1\]"),
    ('name = "x"\nnative = ["aten::no_such_op*"]', r"key 'native'.*'aten::no_such_op\*'.*no op of this torch"),
    ('name = "x"\ncolour = "red"', r"key 'colour': expected only the keys"),
    ('native = []', r"key 'name': expected a non-empty string"),
    ('name = "x"\nbase = "tpu"', r"key 'base': expected one of \['cuda'"),
    ('name = "x"\nbase = "p.toml"', r"key 'base'.*cycle"),
    ('name = "x\nnative = [', r"p\.toml': expected valid TOML, got a syntax error"),
])
def test_invalid_profiles_name_file_key_and_value(tmp_path, text, match):
    with pytest.raises(ProfileError, match="(?s)" + match):
        profiles.load_profile(_write(tmp_path, text))


def test_missing_profile_file(tmp_path):
    with pytest.raises(ProfileError, match=r"expected an existing \.toml profile file.*nope\.toml"):
        profiles.load_profile(str(tmp_path / "nope.toml"))


def test_targets_lists_simulated_profiles_with_counts():
    rows = {r["name"]: r for r in torch_adapter.targets() if r["simulated"]}
    assert set(rows) == {"cuda", "mps", "mtia", "npu", "xpu", "cpu"}
    mps = rows["mps"]
    assert mps["native_ops"] == 890 and mps["composite_ops"] > 1000 and mps["fallback_ops"] > 100
    assert rows["mtia"]["complete"] is False and "incomplete" in rows["mtia"]["details"]["note"]
    assert rows["xpu"]["complete"] is True and rows["xpu"]["details"]["vendor_listed"] == 1042


def test_install_a_toml_profile(tmp_path):
    path = _write(tmp_path, 'name = "tiny"\nbase = "mps"\nfallback = ["aten::mm"]\n')
    session = torch_adapter.install(target=path, simulate=True)
    assert session.target.name == "tiny" and session.target.simulated
    assert profiles.profile_for(session.target).source == path
    assert session.routing is not None and "aten::mm" in session.routing.overrides
