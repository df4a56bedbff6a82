"""`torch-adapter fix` / `%adapter fix`: fallbacks and refusals of a real run turned into verified patches.

Every test runs the real thing: `python -m torch_adapter fix` (which runs the program under
`torch-adapter run` on fresh copies of the project) on small programs written into tmp_path, and a real
in-process IPython shell for the magic. The rewrite table (check/fix.py REWRITES) is checked entry by
entry on the ops it names, the einsum forms against torch.einsum itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_adapter.check.fix import Record, plan_source
from torch_adapter.check.fix_run import compare_output

REPO = Path(__file__).resolve().parents[1]

# a target whose einsum runs on the CPU: the npu table with aten::einsum forced to fall back (TA-F002)
EINSUM_NPU = 'name = "einsum-npu"\nbase = "npu"\nfallback = ["aten::einsum"]\n'

ATTENTION = '''\
import torch

torch.manual_seed(0)
q = torch.randn(2, 5, 4).cuda()
k = torch.randn(2, 6, 4).cuda()
v = torch.randn(2, 6, 3).cuda()
scores = torch.einsum("b i d, b j d -> b i j", q, k) / 2
out = torch.einsum("b i j, b j d -> b i d", scores.softmax(-1), v)
print("out", out.sum().item(), out.abs().max().item())
'''


def fix(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "adapter"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "torch_adapter", "fix", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# --- the rewrite table, on source text ----------------------------------------------------------------
def _apply(src: str, *records: Record) -> tuple[str, list, list]:
    return plan_source(src, list(records))


@pytest.mark.parametrize("eq,shapes", [("b i d, b j d -> b i j", [(2, 5, 4), (2, 6, 4)]),
                                       ("bij,bjd->bid", [(2, 5, 6), (2, 6, 3)]),
                                       ("ij,jk->ik", [(3, 4), (4, 5)]), ("ii->i", [(4, 4)]),
                                       ("...id,...jd->...ij", [(2, 3, 5, 4), (2, 3, 6, 4)])])
def test_einsum_rewrites_equal_einsum(eq, shapes):
    names = "abc"[:len(shapes)]
    src = f"import torch\ny = torch.einsum({eq!r}, {', '.join(names)})\n"
    new, changes, skipped = _apply(src, Record("fallback", "aten::einsum", "m.py", 2))
    assert not skipped and len(changes) == 1 and "einsum" not in new
    env = {n: torch.randn(*s) for n, s in zip(names, shapes)}
    exec(new, env)
    torch.testing.assert_close(env["y"], torch.einsum(eq, *(env[n] for n in names)))


def test_a_piece_of_einsum_is_fixed_at_its_einsum_and_operators_keep_their_precedence():
    src = "import torch as th\nu = a / th.einsum('bij,bjd->bid', p, v)\n"
    new, changes, _ = _apply(src, Record("fallback", "aten::bmm", "m.py", 2, parent="aten::einsum"))
    assert "u = a / (p @ v)" in new and changes[0].rule.startswith("einsum")


def test_hypot_and_pdist_rewrites_compute_the_same():
    src = "import torch\nh = torch.hypot(a, b + 1)\nd = torch.pdist(x)\n"
    new, changes, skipped = _apply(src, Record("fallback", "aten::hypot", "m.py", 2),
                                   Record("fallback", "aten::_pdist_forward", "m.py", 3))
    assert not skipped and len(changes) == 2 and "hypot" not in new and "pdist" not in new
    env = {"torch": torch, "a": torch.randn(5), "b": torch.randn(5), "x": torch.randn(6, 3)}
    exec(new, env)
    torch.testing.assert_close(env["h"], torch.hypot(env["a"], env["b"] + 1))
    torch.testing.assert_close(env["d"], torch.pdist(env["x"]))


def test_float64_at_the_line_becomes_float32_and_a_float64_from_elsewhere_is_named():
    src = "import torch\nx = torch.ones(3, dtype=torch.float64).cuda().double()\ny = x * 2\n"
    new, changes, skipped = _apply(src, Record("dtype", "aten::_to_copy", "m.py", 2, dtype="float64"),
                                   Record("dtype", "aten::mul", "m.py", 3, dtype="float64"))
    assert "x = torch.ones(3, dtype=torch.float32).cuda().float()" in new
    assert [s.record.line for s in skipped] == [3] and "comes from elsewhere" in skipped[0].why


def test_an_op_without_a_source_rewrite_is_skipped_with_why():
    _, changes, skipped = _apply("import torch\nx = torch.linalg.eigh(a)\n", Record("fallback", "aten::_linalg_eigh", "m.py", 2))
    assert not changes and "no source-level expression" in skipped[0].why


def test_output_comparison_tolerates_small_differences_and_names_the_line():
    assert compare_output("loss 1.00000\n", "loss 1.00001\n", 1e-4, 1e-6) is None
    why = compare_output("a\nloss 1.0\n", "a\nloss 1.5\n", 1e-4, 1e-6)
    assert "output line 2" in why and "1.5" in why
    assert compare_output("t 3.1 ms\nloss 1\n", "t 9.9 ms\nloss 1\n", 1e-4, 1e-6, match=["^loss"]) is None


# --- real runs ----------------------------------------------------------------------------------------
def test_einsum_fallbacks_fixed_verified_applied_and_idempotent(tmp_path):
    root = project(tmp_path, {"attn.py": ATTENTION, "einsum-npu.toml": EINSUM_NPU})
    r = fix(root, "--target", "einsum-npu.toml", "--simulate", "--apply", "attn.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified: attn.py:7" in r.stdout and "verified: attn.py:8" in r.stdout  # the second: next round
    assert "-scores = torch.einsum(" in r.stdout and "+scores = (q @ k.transpose(-2, -1)) / 2" in r.stdout
    text = (root / "attn.py").read_text()
    assert "einsum" not in text and "out = scores.softmax(-1) @ v" in text
    assert not list(root.glob(".*.tmp")) and sorted(p.name for p in root.iterdir()) == ["attn.py", "einsum-npu.toml"]
    again = fix(root, "--target", "einsum-npu.toml", "--simulate", "--apply", "--json", "attn.py")
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert data["records"] == 0 and data["verified"] == [] and data["written"] == []


def test_float64_refusals_fixed_where_results_allow_and_refused_where_they_change(tmp_path):
    program = ("import torch\n"
               "w = torch.linspace(-1, 1, 16, dtype=torch.float64).reshape(4, 4).cuda()\n"
               "x = torch.arange(4).cuda().double()\n"
               "print('y', (w @ x).sum().item())\n"
               "eps = torch.tensor([1e-10], dtype=torch.float64).cuda()\n"
               "print('tiny', (((1 + eps) - 1) * 1e10).item())\n")
    root = project(tmp_path, {"prog.py": program})
    r = fix(root, "--target", "mps", "--simulate", "--apply", "prog.py")
    assert r.returncode == 1, r.stdout + r.stderr  # one refusal left: its change changes the results
    assert "verified: prog.py:2: float64 -> float32" in r.stdout and "verified: prog.py:3: .double() -> .float()" in r.stdout
    assert "not fixed: prog.py:5: float64 -> float32 — output line 2: 1.000000082740371 became 0.0" in r.stdout
    text = (root / "prog.py").read_text()
    assert "dtype=torch.float32).reshape" in text and ".cuda().float()" in text
    assert "eps = torch.tensor([1e-10], dtype=torch.float64)" in text  # that line not written


def test_a_file_outside_the_project_or_a_link_out_of_it_is_not_edited(tmp_path):
    lib = tmp_path / "shared"
    lib.mkdir()
    (lib / "helper.py").write_text("import torch\n\ndef dist(a, b):\n    return torch.hypot(a, b)\n")
    (lib / "attn.py").write_text("import torch\n\ndef scores(q, k):\n    return torch.einsum('bid,bjd->bij', q, k)\n")
    main = (f"import sys\nsys.path.insert(0, {str(lib)!r})\n"
            "import torch\nfrom helper import dist\nfrom link import scores\n"
            "torch.manual_seed(0)\nq, k = torch.randn(2, 3, 4).cuda(), torch.randn(2, 5, 4).cuda()\n"
            "print('s', scores(q, k).sum().item(), dist(q, q).sum().item())\n")
    root = project(tmp_path, {"main.py": main, "einsum-npu.toml": EINSUM_NPU})
    (root / "link.py").symlink_to(lib / "attn.py")
    r = fix(root, "--target", "einsum-npu.toml", "--simulate", "--apply", "main.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{lib / 'helper.py'}:4: aten::hypot (fallback): the file" in r.stdout, r.stdout
    assert "link.py:4: aten::einsum (fallback): the file" in r.stdout and "(a symbolic link out of it)" in r.stdout
    assert r.stdout.count("is outside the project") == 2 and "verified" not in r.stdout
    assert "torch.hypot" in (lib / "helper.py").read_text() and "einsum" in (lib / "attn.py").read_text()


def test_apply_refuses_a_file_not_yours_or_changed_since_and_writes_nothing(tmp_path):
    from torch_adapter.check.fix import plan
    from torch_adapter.check.fix_run import FixError, apply

    root = project(tmp_path, {"a.py": "import torch\ny = torch.einsum('ij,jk->ik', a, b)\n",
                              "b.py": "import torch\ny = torch.hypot(a, b)\n"})
    edits, _ = plan([Record("fallback", "aten::einsum", "a.py", 2), Record("fallback", "aten::hypot", "b.py", 2)],
                    root, root)
    (root / "b.py").write_text("import torch\ny = torch.hypot(a, b)  # edited since\n")
    with pytest.raises(FixError) as info:
        apply(edits, root)
    assert "b.py (line 2): it changed since fix read it" in str(info.value) and "nothing was written" in str(info.value)
    assert "einsum" in (root / "a.py").read_text()  # the good file is not written either
    if os.geteuid() == 0:
        edits, _ = plan([Record("fallback", "aten::einsum", "a.py", 2)], root, root)
        os.chown(root / "a.py", 65534, 65534)
        with pytest.raises(FixError, match=r"a.py \(line 2\): it is owned by uid 65534, not by you"):
            apply(edits, root)


def test_a_program_that_fails_before_any_change_is_a_usage_error(tmp_path):
    root = project(tmp_path, {"bad.py": "raise SystemExit('no data')\n"})
    r = fix(root, "bad.py")
    assert r.returncode == 2 and "expected a program that runs to the end" in r.stderr and "no data" in r.stderr


def test_from_a_routing_json_of_an_earlier_run(tmp_path):
    root = project(tmp_path, {"attn.py": ATTENTION, "einsum-npu.toml": EINSUM_NPU})
    env = {**os.environ}
    subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--target", "einsum-npu.toml", "--simulate",
                    "--report-json", str(tmp_path / "routing.json"), "attn.py"], cwd=root, check=True,
                   capture_output=True, env=env, timeout=300)
    r = fix(root, "--from", str(tmp_path / "routing.json"), "--target", "einsum-npu.toml", "--simulate", "attn.py")
    assert r.returncode == 0 and "verified: attn.py:7" in r.stdout, r.stdout + r.stderr
    assert "einsum" in (root / "attn.py").read_text()  # not written without --apply
    bad = fix(root, "--from", str(root / "einsum-npu.toml"), "attn.py")
    assert bad.returncode == 2 and "--from: expected a routing log" in bad.stderr


# --- the held-out-style program: a small transformer block with einsum attention and float64 ----------
HELD_OUT = '''\
import math
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.h, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        att = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(d // self.h)
        y = torch.einsum("...ij,...jd->...id", att.softmax(-1), v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


torch.manual_seed(0)
model = Block().cuda()
pos = torch.arange(8, dtype=torch.float64).cuda() / 8
x = torch.randn(2, 8, 16).cuda() + pos.float()[None, :, None]
with torch.no_grad():  # inference: see the note in the report on backward through a forced fallback
    y = model(x)
print("out", y.sum().item(), "norm", y.norm().item())
'''


def test_held_out_program_einsum_and_float64(tmp_path):
    prof = 'name = "einsum-mps"\nbase = "mps"\nfallback = ["aten::einsum"]\n'
    root = project(tmp_path, {"block.py": HELD_OUT, "einsum-mps.toml": prof})
    r = fix(root, "--target", "einsum-mps.toml", "--simulate", "--apply", "block.py")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (root / "block.py").read_text()
    assert "einsum" not in text and "dtype=torch.float32" in text
    assert "att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)" in text
    # re-checked: the fixed program runs with no fallback and no refusal at all on that target
    out = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--target", "einsum-mps.toml", "--simulate",
                          "--report-json", str(tmp_path / "after.json"), "block.py"], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    log = json.loads((tmp_path / "after.json").read_text())
    assert log["summary"]["fallback"] == 0 and log["summary"]["refused"] == 0 and not log["dtypes"]["findings"]


# --- tutorial 02's port ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_tutorial_02_sd_port_einsum_fallbacks_removed(tmp_path):
    src = tmp_path / "sd15_training"
    shutil.copytree(REPO / "examples" / "sd15_training", src, ignore=shutil.ignore_patterns("__pycache__", "sd15-finetuned"))
    (src / "einsum-npu.toml").write_text(EINSUM_NPU)
    args = ["train.py", "--max-steps", "1", "--batch-size", "2", "--num-samples", "4", "--output-dir", "out"]
    r = fix(src, "--target", "einsum-npu.toml", "--simulate", "--match", "^done:", "--apply", *args, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified: models.py:175" in r.stdout and "verified: models.py:182" in r.stdout
    text = (src / "models.py").read_text()
    assert "scores = (query @ key.transpose(-2, -1)) * attn.scale" in text
    assert "hidden_states = probs @ value" in text and "torch.einsum(" not in text
    out = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--target", "einsum-npu.toml", "--simulate",
                          "--report-json", str(tmp_path / "after.json"), *args], cwd=src, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "after.json").read_text())["summary"]["fallback"] == 0


# --- %adapter fix in a real IPython shell ---------------------------------------------------------------
@pytest.fixture
def ip():
    from IPython.testing import globalipapp

    shell = globalipapp.start_ipython() or globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "torch_adapter")
    yield shell
    shell.run_line_magic("unload_ext", "torch_adapter")


def test_adapter_fix_magic_patches_the_cell_and_sets_the_next_input(ip, tmp_path):
    from IPython.utils.capture import capture_output

    prof = tmp_path / "einsum-npu.toml"
    prof.write_text(EINSUM_NPU)
    ip.run_line_magic("adapter", f"target {prof} --simulate")
    try:
        ip.run_cell("import torch\ntorch.manual_seed(0)", store_history=True)
        cell = ('%adapter policy allow\nq = torch.randn(2, 5, 4).cuda(); k = torch.randn(2, 6, 4).cuda()\n'
                's = torch.einsum("b i d, b j d -> b i j", q, k) / 2\nprint(s.sum().item())')
        assert ip.run_cell(cell, store_history=True).success
        s_before = ip.user_ns["s"]
        with capture_output() as cap:
            result = ip.run_cell("%adapter fix --apply", store_history=True)
        assert result.success, cap.stderr
        assert "+s = (q @ k.transpose(-2, -1)) / 2" in cap.stdout and "verified: cell [" in cap.stdout, cap.stdout
        fixed = ip.user_ns["_adapter_fix"]["cell"]["source"]
        assert fixed.startswith("%adapter policy allow\n") and "einsum" not in fixed
        assert ip.rl_next_input == fixed
        assert ip.user_ns["s"] is s_before  # the verifying runs used a copy of the namespace
    finally:
        ip.run_line_magic("adapter", "target auto")
