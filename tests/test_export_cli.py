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


_MARKING_FACTORY = (
    "import pathlib, torch\n"
    "def build():\n"
    "    pathlib.Path(__file__).with_name('BUILT').write_text('built')\n"
    "    return torch.nn.Linear(2, 2), (torch.randn(1, 2),)\n")


def test_export_cli_checks_both_outputs_before_building_the_model(tmp_path):
    (tmp_path / "facs.py").write_text(_MARKING_FACTORY)
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    (tmp_path / "m.routing.json").symlink_to(victim)
    for output, why in ((tmp_path / "missing" / "m.pt2", "the folder does not exist"),
                        (tmp_path / "m.pt2", "it is a symbolic link")):
        res = run_cli("export", "--model", "facs.py:build", "--output", str(output), cwd=tmp_path)
        assert res.returncode == 2, res.stderr
        assert why in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "BUILT").exists()  # refused before any work
    assert not (tmp_path / "missing").exists()  # folders are not created
    assert victim.read_text() == "precious"


def test_export_cli_keeps_the_mode_of_files_it_replaces(tmp_path):
    import os
    import stat

    (tmp_path / "facs.py").write_text(_MARKING_FACTORY)
    for name in ("m.pt2", "m.routing.json"):
        (tmp_path / name).write_text("old")
        os.chmod(tmp_path / name, 0o640)
    res = run_cli("export", "--model", "facs.py:build", "--output", str(tmp_path / "m.pt2"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "m.routing.json").read_text())["schema"] == "torch-adapter.export"
    assert [stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in ("m.pt2", "m.routing.json")] == [0o640, 0o640]
    assert torch.export.load(str(tmp_path / "m.pt2")) is not None
