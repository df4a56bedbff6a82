"""The benchmark harness: interleaving, ratio math, JSON — with real (tiny) workloads.

No timing assertions: this machine is shared; only the bookkeeping is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import harness, workloads  # noqa: E402
from torch_adapter.errors import UsageError  # noqa: E402


def _recording(name: str, log: list[str]) -> harness.Configuration:
    @contextlib.contextmanager
    def context():
        log.append(name)
        yield

    return harness.Configuration(name, context, "cpu")


def test_schedule_abab_and_abba():
    assert harness.schedule(["a", "b"], 3) == ["a", "b", "a", "b", "a", "b"]
    assert harness.schedule(["a", "b", "c"], 2, "abba") == ["a", "b", "c", "c", "b", "a"]
    with pytest.raises(UsageError, match="order 'abab' or 'abba'"):
        harness.schedule(["a"], 1, "random")


def test_run_interleaves_blocks_in_schedule_order():
    log: list[str] = []
    configs = [_recording("a", log), _recording("b", log)]
    result = harness.run(workloads.mlp, configs, repeats=3, steps=2, warmup=1, settle=0)
    # first one build per configuration, then one context entry per block, ABAB
    assert log == ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert result.schedule == ["a", "b"] * 3
    for cfg in result.configs:
        assert len(cfg.wall) == len(cfg.cpu) == 3
        assert all(t > 0 for t in cfg.wall)


def test_timed_context_is_entered_inside_each_timed_block():
    log: list[str] = []
    outer, inner = _recording("outer", log), _recording("inner", log)
    cfg = harness.Configuration("x", outer.context, "cpu", timed=inner.context)
    harness.run(workloads.mlp, [cfg], repeats=2, steps=1, warmup=0, settle=1)
    assert log == ["outer", "inner"] * 3  # build + two blocks


def test_ratios_are_computed_from_medians():
    base = harness.ConfigResult("plain", "cpu", "", None, wall=[1.0, 3.0, 2.0], cpu=[1.0, 1.0, 1.0])
    other = harness.ConfigResult("x", "cpu", "", 0.9, wall=[2.0, 4.0, 2.5], cpu=[2.0, 2.0, 2.0])
    result = harness.BenchResult("t", "mlp", 3, 1, 0, 0, "abab", [], [base, other], {})
    harness._summarize(result)
    assert base.kept == 1.0
    assert other.median_s == 2.5
    assert other.kept == pytest.approx(2.0 / 2.5)  # median(plain) / median(x)
    assert other.paired_kept == pytest.approx(0.75)  # median of 0.5, 0.75, 0.8
    assert (other.paired_min, other.paired_max) == (pytest.approx(0.5), pytest.approx(0.8))
    assert other.best_kept == pytest.approx(1.0 / 2.0)
    assert other.cpu_kept == pytest.approx(0.5)
    assert other.passed is False and base.passed is None
    assert other.throughput == pytest.approx(1 / 2.5)


def test_json_written_and_readable(tmp_path):
    result = harness.run(workloads.mlp, [harness.plain("cpu"), harness.plain("cpu", name="again")],
                         repeats=2, steps=1, warmup=0, name="unit")
    path = harness.write_json(result, tmp_path)
    assert path == tmp_path / "unit.json"
    data = json.loads(path.read_text())
    assert data["workload"] == "mlp" and data["repeats"] == 2
    assert [c["name"] for c in data["configs"]] == ["plain", "again"]
    assert data["configs"][0]["kept"] == 1.0
    assert len(data["configs"][1]["wall"]) == 2
    assert "torch" in data["meta"]


def test_min_block_raises_steps():
    # a ~1 ms step: a 0.3 s block needs far more than one step, however busy the machine
    result = harness.run(workloads.mlp, [harness.plain("cpu")], repeats=1, steps=1, warmup=2, min_block_s=0.3)
    assert result.steps > 1


def test_time_budget_stops_after_two_rounds():
    result = harness.run(workloads.mlp, [harness.plain("cpu"), harness.plain("cpu", name="b")],
                         repeats=6, steps=1, warmup=0, budget_s=0.0)
    assert result.repeats == 2 and result.meta["stopped_early"] is True
    assert result.schedule == ["plain", "b", "plain", "b"]
    assert [len(c.wall) for c in result.configs] == [2, 2]


def test_adapted_configuration_runs_the_cuda_written_workload():
    result = harness.run(workloads.mlp, [harness.plain(), harness.adapted("cpu", goal=0.5)],
                         repeats=2, steps=1, warmup=0)
    adapted = result.by_name("adapted")
    assert adapted.device == "cuda" and result.by_name("plain").device == "cpu"
    assert adapted.kept > 0


def test_cli_helpers_select_and_write(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser, workloads=["mlp"])
    out = tmp_path / "cli.json"
    args = parser.parse_args(["--workload", "mlp", "--configs", "plain", "--repeats", "1", "--steps", "1",
                              "--warmup", "0", "--min-block", "0", "--json", str(out), "-q"])
    results = harness.run_from_args(args, [workloads.mlp], [harness.plain("cpu"), harness.plain("cpu", name="b")],
                                    default_name="unit")
    assert [c.name for c in results[0].configs] == ["plain"]
    assert json.loads(out.read_text())["name"] == "cli"
    assert "[1/" not in capsys.readouterr().err  # -q: no progress lines
    with pytest.raises(UsageError, match="--configs"):
        harness.select([harness.plain("cpu")], "plain,nope")


def test_run_rejects_bad_arguments():
    with pytest.raises(UsageError, match="at least one configuration"):
        harness.run(workloads.mlp, [], repeats=1)
    with pytest.raises(UsageError, match="distinct configuration names"):
        harness.run(workloads.mlp, [harness.plain("cpu"), harness.plain("cpu")], repeats=1)
    with pytest.raises(UsageError, match="one of"):
        workloads.get("resnet9000")


def test_loaded_counts_other_works_load_not_the_benchmarks_own():
    # a single-threaded benchmark alone on an idle 2-core machine reads a 1-minute load of ~1.0
    assert not harness.is_loaded([1.0, 0.8, 0.6], 2, own=1.0)
    assert harness.is_loaded([2.2, 1.0, 0.8], 2, own=1.0)  # another busy process besides it
    assert harness.is_loaded([1.2, 0.5, 0.5], 2)  # read before the benchmark started: all of it is others'
    assert not harness.is_loaded(None, 2)
    cond = harness.conditions(1, own=1.0)
    assert cond["own_load"] == 1.0 and cond["loaded"] == harness.is_loaded(cond["loadavg"], cond["cpu_count"], 1.0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_a_pinned_child_runs_on_the_cpu_it_was_given():
    import subprocess

    cpus = sorted(os.sched_getaffinity(0))
    assert harness.default_pin() == (cpus[-1] if len(cpus) > 1 else -1)
    assert harness.pinned(-1) is None
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=harness.pinned(cpus[0])).stdout
    assert out.strip() == str([cpus[0]])


def test_lowp_attribution_sums_real_profiles_by_group():
    """The op-by-op attribution (benchmarks/lowp_attribution.py) over two real torch.profiler runs:
    every op's difference is adapted - plain, the groups partition the ops, and their sums add up."""
    import torch

    from benchmarks import lowp_attribution, lowp_programs

    a = torch.randn(64, 64)

    def plain() -> None:
        torch.mm(a, a).add(a)

    def adapted() -> None:
        torch.mm(a.half().float(), a).add(a).to(torch.float16)

    samples = {"plain": [{"ops": lowp_programs._profiled(plain, 2), "ms": [1.0]} for _ in range(2)],
               "adapted": [{"ops": lowp_programs._profiled(adapted, 2), "ms": [2.0]} for _ in range(2)]}
    got = lowp_attribution.attribute(samples, {"aten::mm"})
    assert got["per_op_us"]["aten::mm"]["calls"] == 1  # once per program call
    assert got["per_op_us"]["aten::_to_copy"]["plain"] == 0 and got["per_op_us"]["aten::_to_copy"]["adapted"] > 0
    for row in got["per_op_us"].values():
        assert row["difference"] == pytest.approx(row["adapted"] - row["plain"])
    groups = got["groups_us"]
    assert set(groups) == {"rewritten", "casts", "other"}
    assert groups["rewritten"]["plain"] == pytest.approx(got["per_op_us"]["aten::mm"]["plain"])
    for key in ("plain", "adapted", "difference"):
        assert sum(g[key] for g in groups.values()) == pytest.approx(got["total_us"][key])
    assert sum(g["share_of_difference"] for g in groups.values()) == pytest.approx(1.0)
    assert got["wall_ms"] == {"plain": 1.0, "adapted": 2.0}


def test_attention_dtype_benchmark_records_both_dtypes_and_the_conditions(tmp_path, monkeypatch):
    """bench_attention_dtype.py: each shape's forward (and backward) in both dtypes, the ratio from
    those times, the CPU's flags beside them (no timing asserted)."""
    from benchmarks import bench_attention_dtype as bench

    data = bench.measure(repeats=1, shapes=((1, 2, 32, 16, 8),), backward=True)
    (row,) = data["attention"]
    assert row["shape"] == [1, 2, 32, 16, 8]
    for part in ("forward", "backward"):
        times = row[part]
        assert times["float32_ms"] > 0 and times["bfloat16_ms"] > 0
        assert times["ratio"] == pytest.approx(times["bfloat16_ms"] / times["float32_ms"], rel=1e-2)
    assert data["forward_ratio_range"] == [row["forward"]["ratio"]] * 2
    assert len(data["matmul"]) == len(bench.MATMULS)
    monkeypatch.setattr(bench, "SHAPES", ((1, 2, 32, 16, 8),))
    monkeypatch.setattr(bench, "MATMULS", ((16, 16, 16),))
    monkeypatch.setattr(bench.harness, "FIGURES_DIR", tmp_path / "figures")  # --figures: the committed folder
    monkeypatch.setattr(bench.harness, "RESULTS_DIR", tmp_path / "results")  # else: the git-ignored one
    assert bench.main(["--repeats", "1", "--figures"]) == 0
    written = json.loads((tmp_path / "figures" / "attention_dtype.json").read_text())
    assert written["meta"]["cpu"]["flags"] and "loaded" in written["meta"] and written["threads"] == 1
    assert bench.main(["--repeats", "1"]) == 0
    assert (tmp_path / "results" / "attention_dtype.json").exists()


def test_decode_split_measures_each_observation_layer_against_the_redirected_step():
    """bench_decode.in_process_split: the four layers interleaved on the decode step, the ratios and
    per-call costs computed from those medians, the dispatcher calls counted (no timing asserted)."""
    pytest.importorskip("transformers")
    from benchmarks import bench_decode
    from torch_adapter.routing import observe

    if not observe.is_compiled_available():
        pytest.skip("needs the C++ observer (a C++ compiler and ninja)")
    split = bench_decode.in_process_split(rounds=2)
    assert set(split["median_ms"]) == {"redirect", "rf_floor", "observer", "trace"}
    assert split["dispatcher_calls"] > 1000  # 32 tokens through 2 GPT-2 layers
    med, calls = split["median_ms"], split["dispatcher_calls"]
    for name in ("rf_floor", "observer", "trace"):  # 2 rounds: the medians are the means of the pairs
        assert 0 < split["kept"][name] and med[name] > 0
        assert split["ns_per_call"][name] == pytest.approx((med[name] - med["redirect"]) * 1e6 / calls, abs=1.0)
    import torch_adapter

    assert torch_adapter.current() is None  # the split leaves no session behind


def test_a_run_writes_the_committed_figures_only_when_asked(tmp_path, capsys):
    """No --json: benchmarks/results/ (git-ignored); a bare --json NAME: docs/figures/ (the commands
    docs/figures/README.md lists); a path: as given. Before, a run with no flag wrote into docs/figures/."""
    import subprocess

    assert harness.json_folder("optimize") == harness.FIGURES_DIR == ROOT / "docs" / "figures"
    assert harness.json_folder(tmp_path / "x.json") == tmp_path
    ignored = subprocess.run(["git", "check-ignore", "-q", str(harness.RESULTS_DIR / "probe.json")], cwd=ROOT)
    assert ignored.returncode == 0, "benchmarks/results/ must be git-ignored"
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser, workloads=["mlp"])
    args = parser.parse_args(["--workload", "mlp", "--configs", "plain", "--repeats", "1", "--steps", "1",
                              "--warmup", "0", "--min-block", "0", "-q"])
    name = f"test_default_folder_{os.getpid()}"
    harness.run_from_args(args, [workloads.mlp], [harness.plain("cpu")], default_name=name)
    written = harness.RESULTS_DIR / f"{name}_mlp.json"
    try:
        assert written.exists() and f"wrote {written}" in capsys.readouterr().out
        assert not (harness.FIGURES_DIR / written.name).exists()
    finally:
        written.unlink(missing_ok=True)


def test_bench_check_writes_its_figure_only_with_figures(tmp_path):
    import subprocess

    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.py").write_text("import torch\nx = torch.zeros(2).cuda()\n")
    name = f"test_check_{os.getpid()}"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_check.py"), "--path", str(tmp_path / "tree"),
           "--repeats", "1", "--jobs", "1", "--json", name]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    written = ROOT / "benchmarks" / "results" / f"{name}.json"
    try:
        assert res.returncode == 0, res.stderr[-2000:]
        assert f"wrote {written}" in res.stdout.replace("\n", "") or str(written) in res.stdout, res.stdout
        assert json.loads(written.read_text())["total"]["files"] == 1
        assert not (ROOT / "docs" / "figures" / f"{name}.json").exists()
    finally:
        written.unlink(missing_ok=True)
