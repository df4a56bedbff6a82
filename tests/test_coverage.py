"""`torch-adapter coverage`: measured op coverage by model family × target (issue 9).

Real models (tiny configs, random weights), real simulated targets, real files; no mocks.
Most tests use the small families; one module fixture runs every built-in family on mps.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torch_adapter
from torch_adapter.coverage import data, engine, factories, models, render
from torch_adapter.coverage.cli import main as coverage_main
from torch_adapter.errors import UsageError
from torch_adapter.routing.log import RoutingLog

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["custom_op", "lstm", "gpt2"]
DEMO = models.DEMO_OP


@pytest.fixture(scope="module")
def small():
    return engine.measure(models=SMALL, targets=["cuda", "mps", "mtia", "host"])


@pytest.fixture(scope="module")
def every_family_on_mps():
    return engine.measure(targets=["mps"])


def _all_rows(*reports):
    return [row for report in reports for row in report.rows]


# -- the numbers --------------------------------------------------------------------------------
def test_shares_add_up_to_100(small, every_family_on_mps):
    for row in _all_rows(small, every_family_on_mps):
        assert row.error is None, (row.model, row.target, row.error)
        assert row.total_calls > 0 and row.total_ops > 0
        assert sum(row.calls_pct.values()) == pytest.approx(100, abs=0.02), (row.model, row.target)
        assert sum(row.ops_pct.values()) == pytest.approx(100, abs=0.02), (row.model, row.target)
        assert row.total_ops <= row.total_calls


def test_every_family_has_a_row_per_target(small, every_family_on_mps):
    assert every_family_on_mps.models == tuple(models.builtin_names())
    assert [(r.model, r.target) for r in every_family_on_mps.rows] == [(m, "mps") for m in models.builtin_names()]
    assert small.targets == ("cuda", "mps", "mtia", "host (cpu)")
    assert {(r.model, r.target) for r in small.rows} == {(m, t) for m in SMALL for t in small.targets}
    assert small.row("lstm", "host (cpu)").simulated is False and small.row("lstm", "mps").simulated


def test_rows_are_consistent_with_explain(small, every_family_on_mps):
    listed = 0
    for row in _all_rows(small, every_family_on_mps):
        for f in row.top_fallbacks:
            decision = torch_adapter.explain(f.op, target=row.target_spec)
            assert decision.route == torch_adapter.Route.FALLBACK, (row.model, row.target, f.op, decision)
            assert f.reason == decision.reason and not f.inside
            listed += 1
        for f in row.nested_fallbacks:  # pieces: the op lacks a kernel, or its decomposition led back to it
            decision = torch_adapter.explain(f.op, target=row.target_spec)
            assert f.inside and (decision.route == torch_adapter.Route.FALLBACK or "decomposition" in f.reason)
    assert listed >= 5


def test_real_host_has_no_fallbacks_and_simulated_rows_name_them(small):
    for model in SMALL:
        assert small.row(model, "host (cpu)").calls["fallback"] == 0
    lstm = small.row("lstm", "mps")  # the host's oneDNN LSTM is routed as mps's own _lstm_mps
    assert lstm.calls["fallback"] == 0 and lstm.top_fallbacks == ()
    assert torch_adapter.explain("aten::mkldnn_rnn_layer", target="mps").op == "aten::_lstm_mps"
    custom = small.row("custom_op", "mps")  # a custom op with a CPU kernel only falls back everywhere
    assert [f.op for f in custom.top_fallbacks] == [DEMO]
    assert small.row("gpt2", "cuda").total_calls < small.row("gpt2", "mps").total_calls  # foreach AdamW on cuda


def test_custom_op_is_fallback_until_register_accelerated():
    op = models.demo_op()
    before = engine.measure(models=["custom_op"], targets=["mps"]).rows[0]
    assert [f.op for f in before.top_fallbacks] == [DEMO]
    assert "no MPS kernel and no decomposition" in before.top_fallbacks[0].reason

    torch_adapter.install(target="mps", simulate=True)
    handle = torch_adapter.register_accelerated(DEMO, lambda x: torch_adapter_gelu(x), device="mps")
    assert torch_adapter.explain(DEMO, target="mps").route == torch_adapter.Route.NATIVE
    after = engine.measure(models=["custom_op"], targets=["mps"]).rows[0]
    assert after.calls["fallback"] == 0 and after.top_fallbacks == ()
    assert after.calls["native"] == before.calls["native"] + 1 and after.total_calls == before.total_calls
    assert after.nested_calls["native"] >= 1  # the registered kernel's own pieces

    handle.remove()
    again = engine.measure(models=["custom_op"], targets=["mps"]).rows[0]
    assert [f.op for f in again.top_fallbacks] == [DEMO]
    assert op is models.demo_op()  # registered once per process


def torch_adapter_gelu(x):
    import torch

    return torch.nn.functional.gelu(x)


def test_measure_will_not_drop_an_installed_sessions_registrations():
    models.demo_op()
    torch_adapter.install(target="mps", simulate=True)
    torch_adapter.register_accelerated(DEMO, torch_adapter_gelu, device="mps")
    with pytest.raises(UsageError, match=r"(?s)only the installed target \(mps\).*got targets cuda.*Fix: measure"):
        engine.measure(models=["custom_op"], targets=["mps", "cuda"])


def test_toml_profile_target_and_forced_fallback(tmp_path):
    profile = tmp_path / "my_npu.toml"
    profile.write_text('name = "my-npu"\nbase = "mps"\nfallback = ["aten::addmm"]\n')
    row = engine.measure(models=["custom_op"], targets=[str(profile)]).rows[0]
    assert row.target == "my-npu" and row.target_spec == str(profile) and row.simulated
    forced = {f.op: f for f in row.top_fallbacks}["aten::addmm"]
    assert "forced to the CPU" in forced.reason
    assert torch_adapter.explain("aten::addmm", target=row.target_spec).route == torch_adapter.Route.FALLBACK


def test_analyse_counts_each_call_once_at_the_top_level():
    log = RoutingLog("mps", True)
    log.add("aten::mm", "native", calls=6)
    log.add("aten::mm", "fallback", calls=2, reason="forced")
    log.add("aten::sum.dim_IntList", "composite", calls=3)
    log.add("aten::sum.dim_IntList", "fallback", calls=3, parent="aten::sum.dim_IntList", reason="calls itself")
    log.add("prims::sum", "composite", calls=3, parent="aten::sum.dim_IntList")
    log.add("aten::nonzero", "fallback", calls=0, reason="bytes only")  # counted by the recorder elsewhere
    counts = engine.analyse(log, top=5)
    assert counts["calls"] == {"native": 6, "composite": 3, "fallback": 2}
    assert counts["ops"] == {"native": 0, "composite": 1, "fallback": 1}  # aten::mm: its least native route
    assert counts["nested_calls"] == {"native": 0, "composite": 3, "fallback": 3}
    assert [f.op for f in counts["top_fallbacks"]] == ["aten::mm"]
    nested = counts["nested_fallbacks"][0]
    assert (nested.op, nested.calls, nested.inside) == ("aten::sum.dim_IntList", 3, ("aten::sum.dim_IntList",))
    assert engine.analyse(log, top=0)["top_fallbacks"] == ()


# -- user factories -----------------------------------------------------------------------------
FACTORIES = '''
import torch

def two():
    """A two-layer MLP (default loss)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)), (torch.randn(4, 8),)

def three():
    model = torch.nn.Linear(8, 2)
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    return model, {"input": x}, lambda out: torch.nn.functional.mse_loss(out, y)

NOT_CALLABLE = 42
def model_only(): return torch.nn.Linear(2, 2)
def four(): return torch.nn.Linear(2, 2), (torch.randn(1, 2),), None, None
def not_a_module(): return "model", (torch.randn(1, 2),)
def list_inputs(): return torch.nn.Linear(2, 2), [torch.randn(1, 2)]
def bad_loss(): return torch.nn.Linear(2, 2), (torch.randn(1, 2),), "mse"
def broken_step(): return torch.nn.Linear(2, 2), (torch.randn(1, 3),)
def no_grad_output(): return torch.nn.Linear(2, 2), (torch.randn(1, 2),), lambda out: out.detach().sum()
def raises(): raise KeyError("vocab.json")
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "cov_user_models.py").write_text(textwrap.dedent(FACTORIES))
    (tmp_path / "cov_broken_import.py").write_text("import not_installed_dep_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cov_user_models", raising=False)
    return tmp_path / "cov_user_models.py"


def test_user_factories_load_and_measure(user_module):
    spec_file = f"{user_module}:three"
    report = engine.measure(models=["cov_user_models:two", spec_file], targets=["mps"])
    two, three = report.rows
    assert two.model == "cov_user_models:two" and two.kind == "User" and two.description == "A two-layer MLP (default loss)."
    assert three.model == "cov_user_models.py:three" and report.meta["sources"][three.model] == spec_file
    for row in report.rows:
        assert row.error is None and row.calls["native"] > 0
        assert sum(row.calls_pct.values()) == pytest.approx(100, abs=0.02)


@pytest.mark.parametrize("spec, pattern", [
    ("no_such_module_xyz:build", r"(?s)expected an importable module.*'no_such_module_xyz' \(module not found\).*Fix: "),
    ("cov_user_models:missing", r"(?s)expected a function 'missing'.*got no attribute 'missing'.*Why:.*Fix: use one of its callables: bad_loss, "),
    ("cov_user_models:NOT_CALLABLE", r"(?s)expected a callable factory, got 42 \(int\).*Fix: make NOT_CALLABLE a function"),
    ("cov_user_models:model_only", r"(?s)expected a tuple \(model, example_inputs\).*got Linear.*Fix: end the factory"),
    ("cov_user_models:four", r"got a tuple of 4"),
    ("cov_user_models:not_a_module", r"(?s)expected a torch.nn.Module first.*got 'model' \(str\)"),
    ("cov_user_models:list_inputs", r"expected example_inputs as a tuple, a dict or a tensor, got list"),
    ("cov_user_models:bad_loss", r"expected a callable loss_fn\(output\) -> scalar tensor third, got 'mse' \(str\)"),
    ("cov_user_models:broken_step", r"(?s)expected a step that runs without the adapter, got RuntimeError: .*Fix: check the factory"),
    ("cov_user_models:no_grad_output", r"(?s)a step that runs without the adapter.*does not require grad"),
    ("cov_user_models:raises", r"(?s)expected a factory that builds the model, got KeyError: 'vocab.json'"),
    ("cov_broken_import:build", r"(?s)expected a module 'cov_broken_import' that imports cleanly, got "
                                r"ModuleNotFoundError: No module named 'not_installed_dep_xyz'"),
    ("missing_file_xyz.py:build", r"expected an existing Python file before ':'"),
    ("resnt", r"(?s)got 'resnt'.*did you mean resnet\?"),
    ("module:", r"expected MODULE:FACTORY"),
])
def test_bad_factories_give_clear_errors(user_module, spec, pattern):
    with pytest.raises(UsageError, match=pattern) as info:
        engine.measure(models=[spec], targets=["mps"])
    assert "expected" in str(info.value) and "got" in str(info.value)


def test_bad_targets_and_arguments():
    with pytest.raises(torch_adapter.errors.AdapterError, match="built-in profile"):
        engine.measure(models=["custom_op"], targets=["nosuchtarget"])
    with pytest.raises(UsageError, match=r"each target once, got 'mps' twice"):
        engine.parse_targets("mps,mps")
    with pytest.raises(UsageError, match=r"an int >= 0"):
        engine.measure(models=["custom_op"], targets=["mps"], top=-1)
    with pytest.raises(UsageError, match=r"each family once"):
        factories.resolve_models("lstm,lstm")


# -- renderings -----------------------------------------------------------------------------------
def test_json_schema(small):
    doc = json.loads(render.render_json(small))
    assert doc["schema"] == "torch-adapter.coverage" and doc["version"] == 1
    assert {"scope", "counting", "torch", "targets", "models", "rows", "meta"} <= set(doc)
    assert "not the target's speed" in doc["scope"]
    row = doc["rows"][0]
    assert {"model", "kind", "target", "target_spec", "simulated", "calls", "calls_pct", "ops", "ops_pct",
            "nested_calls", "top_fallbacks", "nested_fallbacks", "error"} <= set(row)
    assert set(row["calls_pct"]) == set(row["ops_pct"]) == {"native", "composite", "fallback"}
    assert row["calls"]["total"] == sum(row["calls"][r] for r in data.ROUTES)
    assert data.CoverageReport.from_dict(doc) == small
    with pytest.raises(UsageError, match=r"expected schema 'torch-adapter.coverage' version 1"):
        data.CoverageReport.from_dict({"schema": "torch-adapter.routing-log", "version": 1})


def test_terminal_and_markdown(small):
    text = render.render_text(small, width=160)
    assert "not the target's speed" in text and f"{DEMO} ×1" in text and "host-selected" not in text
    narrow = render.render_text(small, width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80 and "custom_op on mps:" in narrow
    md = render.render_markdown(small)
    assert md.count("\n| custom_op | ") == len(small.targets) + 1  # every row, and the by-target table
    pivot = next(line for line in md.splitlines() if line.startswith("| custom_op | ") and " / " in line)
    assert pivot.count(" / ") == 2 * len(small.targets)  # native / composite / fallback per target
    assert "| Custom op | " in md and "(on the device " in md
    assert "> **Scope.**" in md and f"`{DEMO}` ×1" in md


def test_cli_writes_json_and_self_contained_html(tmp_path, capsys):
    out_json, out_html = tmp_path / "cov.json", tmp_path / "cov.html"
    out_html.write_text("old")
    from torch_adapter.cli.main import main

    code = main(["coverage", "--models", "custom_op", "--targets", "mps", "--json", str(out_json),
                 "--html", str(out_html), "--top", "3"])
    assert code == 0
    printed = capsys.readouterr()
    assert "custom_op" in printed.out and "not the target's speed" in printed.out
    doc = json.loads(out_json.read_text())
    assert [(r["model"], r["target"]) for r in doc["rows"]] == [("custom_op", "mps")]
    page = out_html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in page and DEMO in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)  # plotly.js is inline, nothing is fetched
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?https?:", page, re.I)
    assert "not the target&#x27;s speed" in page
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


@pytest.mark.parametrize("argv, pattern", [
    (["--targets", "mps,nosuch"], "built-in profile"),
    (["--models", "nosuch"], "neither a built-in family"),
    (["--json", "/no/such/folder/x.json"], "does not exist"),
    (["--top", "-2"], "a number >= 0"),
])
def test_cli_usage_errors_exit_2(argv, pattern, capsys):
    assert coverage_main(["--models", "custom_op", *argv]) == 2
    assert pattern in capsys.readouterr().err


def test_cli_list_models(capsys):
    assert coverage_main(["--list-models"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in models.builtin_names())


def test_help_and_no_import_side_effects():
    done = subprocess.run([sys.executable, "-m", "torch_adapter", "coverage", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--targets" in done.stdout and "not the target's speed" in done.stdout
    probe = ("import sys, torch_adapter\n"
             "assert 'torch_adapter.coverage' not in sys.modules\n"
             "import torch_adapter.coverage as c\n"
             "assert not {'torch', 'diffusers', 'transformers', 'plotly'} & set(sys.modules), sorted(sys.modules)\n"
             "c.measure; c.FAMILIES\n"
             "import torch\n"
             "assert not hasattr(torch.ops.torch_adapter_demo, 'fused_gelu')\n"
             "assert not {'diffusers', 'transformers'} & set(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_modules_declare_all():
    import importlib
    import pkgutil

    import torch_adapter.coverage as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"torch_adapter.coverage.{info.name}")
        if info.name != "__main__":
            assert isinstance(getattr(module, "__all__", None), list), info.name


def test_docs_page_covers_the_builtin_set():
    page = (ROOT / "docs" / "coverage.md").read_text()
    assert "not the target's speed" in page and "torch-adapter.coverage" in page
    for name in models.builtin_names():
        for target in ("cuda", "mps", "npu", "xpu", "mtia"):
            assert f"\n| {name} | {target} | " in page, (name, target)
    assert "| model | cuda | mps | npu | xpu | mtia |" in page  # one column per target
    assert "99.8 %" in page and "How the two differ" in page  # beside the vendors' published figures
