"""Stable reason codes (issue 36, item 1): every route reason carries a code from one table
(core/codes.py) with a documentation section generated from it (docs/reasons.md).

The walk: every op of torch's op table decided on every built-in target (real and simulated),
under the policies that refuse, plus the reasons only a run makes (float16 computed in another dtype,
your registrations, an optimize replacement). None may be unclassified.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_adapter.core import codes
from torch_adapter.routing import ops_table, profiles
from torch_adapter.routing.decide import decide
from torch_adapter.routing.policy import Policy

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_page_is_generated_from_the_table():
    assert (ROOT / "docs" / "reasons.md").read_text() == codes.markdown(), \
        "docs/reasons.md is stale: python -m torch_adapter.core.codes > docs/reasons.md"
    for c in codes.CODES.values():  # every code has its section with all four parts
        assert all((c.title, c.means, c.why, c.todo, c.example)), c.code
    assert len(set(codes.CODES)) == len(codes.CODES)


def _decided() -> dict[str, set[str]]:
    """code -> a few (target, op, route) it was given for, over every op on every built-in target."""
    seen: dict[str, set[str]] = {}
    names = sorted(ops_table.load_table())
    policies = [None, Policy(fallback="error"), Policy(deny=frozenset({"aten::nonzero"}))]
    for target in profiles.builtin_names():
        profile = profiles._builtin(target)
        for policy in policies:
            for name in names:
                d = decide(name, profile, None, policy)
                seen.setdefault(d.code, set()).add(f"{target}:{name}:{d.route.value}:{d.via}:{d.reason[:80]}")
    return seen


def test_every_decided_route_has_a_code():
    seen = _decided()
    assert codes.UNCLASSIFIED not in seen, sorted(seen[codes.UNCLASSIFIED])[:10]
    # the codes decide() gives by itself (the rest come from runs: below)
    assert {"TA-N001", "TA-N003", "TA-N004", "TA-N005", "TA-C001", "TA-C002", "TA-C003", "TA-F001",
            "TA-P001", "TA-P002"} <= set(seen), sorted(seen)


RUN = r"""
import json, warnings, torch, torch_adapter
from torch import nn
out = {}
def codes_of(log):
    return sorted({(r["code"], r["route"]) for r in log.table()})
torch_adapter.install(target="mps", simulate=True)
with torch_adapter.trace() as log:
    x = torch.randn(16, 8, device="cuda")
    torch.pdist(x); torch.linalg.eigh(x.T @ x); torch.nn.functional.huber_loss(x, x * 2)
    x.nonzero(); x.view(8, 16).t().sum()
out["mps"] = codes_of(log)
h = torch_adapter.register_fallback("aten::_pdist_forward", lambda x, p=2.0: torch.cdist(x, x)[0, 1:])
with torch_adapter.trace() as log:
    torch.pdist(x)
out["yours"] = codes_of(log)
h.remove()
handle = torch_adapter.optimize.register(nn.LayerNorm, lambda m, x: torch.nn.functional.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps))
with torch_adapter.trace(use_observer=False) as log:
    nn.LayerNorm(8).cuda()(x)
out["optimize"] = codes_of(log)
handle.remove()
torch_adapter.uninstall()
with torch_adapter.adapted("cpu"):
    with torch_adapter.trace() as log:
        a = torch.randn(32, 32, device="cuda", dtype=torch.float16)
        (a @ a).sum()
    out["cpu_half"] = codes_of(log)
    # what the session decided here: the dtype a float16 request gave (dtype_policy="auto") and the dtype
    # float16 products compute in (None: as float16)
    out["cpu_half_dtypes"] = [str(a.dtype), str(torch_adapter.session.current().low_precision.dtype)]
with torch_adapter.adapted("cpu", dtype_policy="float16"):  # float16 tensors kept on every CPU kind
    with torch_adapter.trace() as log:
        a = torch.randn(32, 32, device="cuda", dtype=torch.float16)
        (a @ a).sum()
    out["cpu_half_kept"] = codes_of(log)
    with torch_adapter.trace() as log:
        s = torch.randn(4, 8, 8, device="cuda")
        w = s @ s.transpose(-2, -1) / 8 ** 0.5
        (w.softmax(-1) @ s).sum()
    out["cpu_attention"] = codes_of(log)
with torch_adapter.adapted("mps", simulate=True, dtype_check="record"):
    with torch_adapter.trace() as log:
        f = torch.randn(4, 4, device="cuda", dtype=torch.float64)
        (f @ f).sum()
    out["dtype"] = sorted({r["code"] for r in log.dtype_table()})
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_the_reasons_only_a_run_makes_have_codes_too():
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"})
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-4000:]
    raw = json.loads(line[0][7:])
    tensors, compute = raw.pop("cpu_half_dtypes")
    out = {k: {tuple(x) if isinstance(x, list) else x for x in v} for k, v in raw.items()}
    everything = {c if isinstance(c, str) else c[0] for v in out.values() for c in v}
    assert codes.UNCLASSIFIED not in everything, out
    assert ("TA-F001", "fallback") in out["mps"] and ("TA-N004", "native") in out["mps"], out["mps"]
    assert ("TA-Y001", "yours") in out["yours"], out["yours"]
    assert ("TA-N006", "native") in out["optimize"], out["optimize"]
    from torch_adapter.core.config import float16_tensors
    from torch_adapter.core.cpu_features import cpu_features

    if cpu_features().float16_compute()[0] != "float16":  # float16 computed in another dtype on this CPU kind
        # a float16 tensor kept as float16 (dtype_policy="float16"): its product is rewritten, with its code
        assert ("TA-C005", "composite") in out["cpu_half_kept"], out["cpu_half_kept"]
        # dtype_policy="auto": a float16 request gives float32 where float16 is computed in float32 (a CPU
        # without fp16/bf16 units: the float32 path, a native product), else float16 and the rewrite
        if cpu_features().float16_compute()[0] == "float32":  # no fp16/bf16 units: the flags decide, nothing measured
            assert compute == "torch.float32", compute
        kept = float16_tensors("auto", compute.replace("torch.", "")) == "float16"
        assert tensors == ("torch.float16" if kept else "torch.float32"), (tensors, compute)
        if kept:
            assert ("TA-C005", "composite") in out["cpu_half"], out["cpu_half"]
        else:
            assert ("TA-N001", "native") in out["cpu_half"] and "TA-C005" not in {c for c, _ in out["cpu_half"]}, out
    assert out["dtype"] == {"TA-D001"}, out["dtype"]


def test_route_code_is_the_same_for_a_row_and_its_decision():
    from torch_adapter.routing.log import RoutingLog

    profile = profiles._builtin("mps")
    log = RoutingLog("mps", simulated=True)
    for name in ("aten::_linalg_eigh", "aten::addmm", "aten::linear", "aten::view"):
        d = decide(name, profile)
        row = log.add_decision(d)
        assert row.code == d.code == row.as_dict()["code"] != codes.UNCLASSIFIED
        assert codes.page(d.code).startswith("docs/reasons.md#ta-")


def test_policies_take_codes_deny_and_allow():
    import warnings

    import torch

    import torch_adapter
    from torch_adapter.errors import FallbackError, UsageError
    from torch_adapter.routing.policy import FallbackWarning

    x = torch.randn(8, 4)
    with torch_adapter.adapted("mps", simulate=True, deny=["TA-F001"]):
        with pytest.raises(FallbackError) as err:
            torch.pdist(x.cuda())
        assert "its reason code TA-F001 is in configure(deny=...)" in str(err.value)
        assert "docs/reasons.md#ta-f001" in str(err.value)
        assert (x.cuda() + 1).sum().item() == pytest.approx((x + 1).sum().item())  # natives run on
    # allow: one op (or one code) falls back silently under a refusing or warning policy
    with torch_adapter.adapted("mps", simulate=True, fallback="error", allow=["aten::_pdist_forward"]):
        torch.testing.assert_close(torch.pdist(x.cuda()).cpu(), torch.pdist(x))
        with pytest.raises(FallbackError):
            torch.linalg.eigh((x.T @ x).cuda())
    with torch_adapter.adapted("mps", simulate=True, fallback="warn", allow=["TA-F001"]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a FallbackWarning would raise here
            torch.pdist(x.cuda())
    with torch_adapter.adapted("mps", simulate=True, fallback="warn"):
        with pytest.warns(FallbackWarning, match="TA-F001"):
            torch.pdist(x.cuda())
    for bad, words in ((["TA-N001"], "a native code"), (["TA-Z999"], "CPU-fallback reason codes"),
                       (None, "refused and allowed at once")):
        kwargs = {"deny": bad} if bad else {"deny": ["TA-F001"], "allow": ["TA-F001"]}
        with pytest.raises(UsageError, match=words):
            torch_adapter.install(target="mps", simulate=True, **kwargs)
        assert torch_adapter.current() is None


def _recorded_kinds() -> set[str]:
    """Every kind a redirect is recorded under, read from the package's source (record/note calls)."""
    import ast

    kinds = set()
    for path in (ROOT / "adapter" / "torch_adapter").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("record", "note") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and len(node.args) >= 3:
                kinds.add(node.args[0].value)
    return kinds


def test_every_kind_of_redirect_has_a_code_and_a_class():
    kinds = _recorded_kinds()
    assert {"device", "amp", "distributed", "probe", "dataloader", "env", "low_precision"} <= kinds, kinds
    for kind in kinds:
        code = codes.redirect_code(kind, "asked", "became")
        assert code != codes.UNCLASSIFIED, kind
        assert codes.redirect_class(code) in ("same", "changed", "dummy")
    assert codes.redirect_class(codes.redirect_code("dataloader", "DataLoader(pin_memory=True)", "pin_memory=False")) \
        == "dummy"
    assert codes.redirect_class(codes.redirect_code("amp", "GradScaler('cuda')", "GradScaler('cpu')")) == "same"


MIGRATION = r"""
import json, torch, torch_adapter
from torch.utils.data import DataLoader
with torch_adapter.adapted("cpu") as s:
    x = torch.ones(4).cuda()                                     # line 5
    with torch.autocast("cuda", dtype=torch.bfloat16):           # line 6
        y = x * 2
    list(DataLoader([1, 2], pin_memory=True))                    # line 8
    for _ in range(3):
        torch.cuda.synchronize()                                 # line 10
    n = torch.cuda.device_count()                                # line 11
    rows = s.redirect_log.to_json()["entries"]
print("RESULT " + json.dumps([[r["line"], r["class"], r["code"], r["source"], r["count"], r["file"]] for r in rows]))
"""


def test_the_migration_log_gives_each_call_its_line_source_and_class(tmp_path):
    script = tmp_path / "port.py"
    script.write_text(MIGRATION)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"})
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-3000:]
    found = json.loads(line[0][7:])
    # every row is the program's own line: torch asking torch.cuda for itself (autocast, DataLoader) is not
    # the program's call to port
    assert {r[5] for r in found} == {str(script)}, found
    counts = {r[0]: r[4] for r in found}
    rows = {r[0]: r[1:4] for r in found}
    assert rows[5] == ["changed", "TA-X001", "x = torch.ones(4).cuda()                                     # line 5"]
    assert rows[6][:2] == ["same", "TA-X002"] and rows[6][2].startswith("with torch.autocast(")
    assert rows[8][:2] == ["dummy", "TA-X008"]
    # torch.cuda's functions, each call counted at its line; on the CPU synchronize does nothing
    assert rows[10] == ["dummy", "TA-X014", "torch.cuda.synchronize()                                 # line 10"]
    assert counts[10] == 3
    assert rows[11][:2] == ["changed", "TA-X005"] and counts[11] == 1
