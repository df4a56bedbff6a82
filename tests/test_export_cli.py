"""`torch-adapter export`: a factory in, a .pt2 and its routing report out."""

import json

import torch

from conftest import run_cli


def test_export_cli_writes_program_and_report(tmp_path):
    (tmp_path / "facs.py").write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))\n"
        "    return m, (torch.randn(3, 4),)\n")
    res = run_cli("export", "--model", "facs.py:build", "--target", "mps", "--output", str(tmp_path / "m.pt2"),
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "m.routing.json").read_text())
    assert report["target"] == "mps" and report["schema"] == "torch-adapter.export"
    program = torch.export.load(str(tmp_path / "m.pt2"))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    torch.testing.assert_close(program.module()(x), m(x))


def test_export_cli_bad_factory_is_a_usage_error(tmp_path):
    res = run_cli("export", "--model", "no_such_module:build", "--output", str(tmp_path / "m.pt2"), cwd=tmp_path)
    assert res.returncode == 2
    assert "model factory 'no_such_module:build': expected an importable module" in res.stderr
    assert not (tmp_path / "m.pt2").exists()
