"""The npu and xpu profiles from the vendors' own op tables (routing/vendor_ops.json).

The shipped table is regenerated from ../shared/target-data and must agree with it; counts are
checked against an independent reading of the vendor files written here (plain yaml, not the
module's parser); bad input (missing or unreadable table, a torch newer than the table, names
this torch lacks) gives notes, never a crash or "everything native".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import torch_adapter
from torch_adapter.routing import ops_table, profiles, vendor_tables
from torch_adapter.routing.decide import Route
from torch_adapter.routing.explain import explain

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "target-data"  # the project's ../shared
needs_data = pytest.mark.skipif(not (DATA / "ascend").is_dir(), reason=f"vendor files not found at {DATA}")
VERSION = ".".join(torch.__version__.split(".")[:2])


def _names(funcs):
    return {re.match(r"\s*([\w.]+)", f).group(1) for f in funcs}


def _covers(spec, version):
    """An independent reading of op-plugin's version specs, for the running torch only."""
    if spec is None:
        return False
    if spec == "all_version" or spec is True:
        return True
    if isinstance(spec, list):
        lo, hi = (tuple(map(int, v.lstrip("v").split("."))) for v in (spec[0], "v99.0" if spec[1] == "newest"
                                                                      else spec[1]))
        return lo <= tuple(map(int, version.split("."))) <= hi
    return f"v{version}" in [v.strip() for v in str(spec).split(",")]


@needs_data
def test_shipped_table_is_regenerated_from_the_vendor_files(tmp_path):
    out = tmp_path / "vendor_ops.json"
    cmd = [sys.executable, "-m", "torch_adapter.routing.vendor_tables"]
    built = subprocess.run([*cmd, "build", str(DATA), "-o", str(out)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert out.read_text() == Path(vendor_tables.DATA_FILE).read_text()  # the shipped copy is up to date
    check = subprocess.run([*cmd, "check", str(DATA)], capture_output=True, text=True)
    assert check.returncode == 0 and "up to date" in check.stdout
    out.write_text(out.read_text().replace('"aten::abs"', '"aten::abz"'))
    stale = subprocess.run([*cmd, "check", str(DATA), "-o", str(out)], capture_output=True, text=True)
    assert stale.returncode == 1 and "STALE" in stale.stdout
    table = json.loads(out.read_text())
    for target in ("npu", "xpu"):
        for info in table["targets"][target]["files"].values():  # provenance beside the data
            assert re.fullmatch(r"[0-9a-f]{40}", info["commit"]) and info["repo"] and info["license"]


@needs_data
def test_counts_agree_with_an_independent_reading():
    plugin = yaml.safe_load((DATA / "ascend" / "op_plugin_functions.yaml").read_text())
    core = yaml.safe_load((DATA / "ascend" / "npu_native_functions.yaml").read_text())
    npu = set()
    for section in ("official", "autograd", "symint"):
        for item in plugin[section]:
            if _covers(item.get("op_api"), VERSION) or _covers(item.get("acl_op"), VERSION):
                npu |= _names([item["func"]])
    npu |= _names([i["func"] if isinstance(i, dict) else i for i in core["supported"]])
    xpu = _names(yaml.safe_load((DATA / "intel-xpu" / "xpu_functions.yaml").read_text())["supported"])
    for item in yaml.safe_load((DATA / "intel-xpu" / "native_functions.yaml").read_text()):
        if any("XPU" in k.replace(" ", "").split(",") for k in (item.get("dispatch") or {})):
            xpu |= _names([item["func"]])
    npu_p, xpu_p = profiles.load_profile("npu"), profiles.load_profile("xpu")
    assert npu_p.listed == len(npu) and xpu_p.listed == len(xpu)
    if VERSION == "2.13":  # ../shared/FACTS.md's independent counts
        assert (len(npu), len(xpu)) == (1091, 1042)
    known = set(ops_table.load_table())
    assert {f"aten::{n}" for n in npu} & known <= set(npu_p.native)


def test_profiles_are_complete_with_counts_in_targets():
    rows = {r["name"]: r for r in torch_adapter.targets() if r["simulated"]}
    for name in ("npu", "xpu"):
        row = rows[name]
        assert row["complete"] is True and row["native_ops"] > 1000
        assert row["details"]["note"].startswith("complete:") and "lists" in row["details"]["note"]
        assert "vendor_ops.json" in row["details"]["profile"]
    assert rows["mtia"]["complete"] is False
    out = subprocess.run([sys.executable, "-m", "torch_adapter", "targets", "--json"], capture_output=True,
                         text=True, env={**os.environ, "COLUMNS": "200"})
    listed = {r["name"]: r for r in json.loads(out.stdout) if r["simulated"]}
    assert listed["npu"]["native_ops"] == rows["npu"]["native_ops"]


def test_acl_op_only_entries_are_native_and_say_so():
    d = explain("aten::lstm_cell", target="npu")  # op-plugin lists it with acl_op only
    assert d.route is Route.NATIVE and "acl_op" in d.reason and "not a CPU fallback" in d.reason
    d = explain("aten::nonzero", target="npu")
    assert d.route is Route.NATIVE and "op_api" in d.reason


def test_absent_from_the_vendor_list_is_composite_when_torch_has_a_composite():
    npu = profiles.load_profile("npu")
    assert not npu.is_native("aten::linalg_eigh")
    d = explain("aten::linalg_eigh", target="npu")
    assert d.route is Route.COMPOSITE
    assert "npu vendor op list" in d.reason and "CompositeImplicitAutograd" in d.reason
    d = explain("aten::embedding", target="xpu")  # XPU lists no embedding: its CompositeExplicit kernel runs
    assert d.route is Route.COMPOSITE and "CompositeExplicitAutograd" in d.reason


def test_install_npu_simulated_runs_and_routes():
    with torch_adapter.adapted(target="npu", simulate=True) as session:
        assert session.target.name == "npu" and session.target.simulated
        x = torch.randn(4, 4)
        with torch_adapter.trace() as log:
            y = torch.nn.functional.gelu(x @ x)
        torch.testing.assert_close(y, torch.nn.functional.gelu(x @ x))
        assert log.routes()["aten::mm"] == "native"


def test_a_torch_newer_than_the_table_gets_a_note():
    known = frozenset(ops_table.load_table())
    sel = vendor_tables.select("npu", "2.99.0", known)
    assert any("newer than the table knows" in n for n in sel.notes)
    assert len(sel.native) > 1000  # open-ended entries still apply
    old = vendor_tables.select("npu", "2.1.0", known)
    assert old.listed != sel.listed  # version-aware: [v2.1, v2.12] entries apply to 2.1 only


def test_names_this_torch_lacks_are_noted():
    known = frozenset(ops_table.load_table()) - {"aten::abs"}
    sel = vendor_tables.select("npu", torch.__version__, known)
    assert "aten::abs" in sel.unknown and "aten::abs" not in sel.native
    assert any("this torch does not have" in n and "ignored" in n for n in sel.notes)


@pytest.mark.parametrize("content", [None, "{not json", json.dumps({"schema": "other"}),
                                     json.dumps({"schema": "torch-adapter.vendor-ops", "targets": {}})])
def test_missing_or_unreadable_table_is_incomplete_not_everything_native(tmp_path, content):
    path = tmp_path / "vendor_ops.json"
    if content is not None:
        path.write_text(content)
    own = frozenset(n for n, e in ops_table.load_table().items() if "XPU" in e.keys)
    p = profiles._vendor_profile("xpu", "XPU", own, torch.__version__, str(path))
    assert p.complete is False and p.native == own and len(own) < 100
    assert "cannot be read" in p.description and "vendor_tables build" in p.description
    assert explain("aten::add.Tensor", target=p).route is not Route.NATIVE


def test_npu_sim_and_xpu_sim_are_adapter_compare_configurations():
    from torch_adapter.jupyter.compare import compare
    from torch_adapter.jupyter.magics import parse_configs

    assert parse_configs("plain,npu-sim,xpu-sim") == ["plain", "npu-sim", "xpu-sim"]
    a = torch.randn(8, 8)
    result = compare(lambda: torch.nn.functional.gelu(a @ a), ["plain", "npu-sim", "xpu-sim"], n=1, warmup=0)
    assert all(result[c]["error"] is None and result[c]["median_s"] for c in ("npu-sim", "xpu-sim")), result
    assert torch_adapter.current() is None  # the session before (none) is back
