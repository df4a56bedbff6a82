"""The JupyterLab extension's package: versions agree, settings are documented, the
TypeScript unit tests pass (node's test runner), and JupyterLab lists it enabled."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

import torch_adapter
from conftest import ROOT

LAB = ROOT / "lab_extension"
NAME = "torch-adapter-labextension"


def test_package_json_version_is_the_python_version():
    package = json.loads((LAB / "package.json").read_text())
    assert package["name"] == NAME
    assert package["version"] == torch_adapter.__version__, (
        f"lab_extension/package.json has version {package['version']!r} but torch_adapter.__version__ is "
        f"{torch_adapter.__version__!r}: bump both together (adapter/torch_adapter/_version.py)")
    assert package["jupyterlab"]["outputDir"] == "../adapter/torch_adapter/labextension"


def test_every_setting_has_a_title_a_description_and_a_default():
    schema = json.loads((LAB / "schema" / "plugin.json").read_text())
    assert schema["title"] and schema["description"]
    assert schema["properties"], "schema/plugin.json declares no settings"
    for key, spec in schema["properties"].items():
        missing = [field for field in ("title", "description", "default") if field not in spec]
        assert not missing, f"setting {key!r} lacks {missing}"


def test_the_lockfile_points_only_at_the_npm_registry():
    lock = (LAB / "package-lock.json").read_text()
    hosts = set(re.findall(r'"resolved": "https?://([^/"]+)', lock))
    assert hosts <= {"registry.npmjs.org"}, hosts


def _npm(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["npm", *args], cwd=LAB, capture_output=True, text=True, timeout=timeout)


def test_typescript_unit_tests():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the TypeScript unit tests need Node.js 20+")
    if not (LAB / "node_modules" / "typescript").is_dir():
        # `pip install -e .` runs npm install; a checkout built another way may lack it.
        installed = _npm("install", "--no-audit", "--no-fund", timeout=600)
        assert installed.returncode == 0, installed.stdout + installed.stderr
    result = _npm("test", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    passed = re.search(r"^# pass (\d+)$", output, re.M)
    failed = re.search(r"^# fail (\d+)$", output, re.M)
    assert passed and failed, output
    assert int(failed.group(1)) == 0 and int(passed.group(1)) >= 20, output


def _labextension_list() -> str:
    # This interpreter's JupyterLab, so a virtual environment lists its own extensions.
    code = ("import sys; from jupyterlab.labextensions import LabExtensionApp; "
            "sys.argv = ['jupyter-labextension', 'list']; LabExtensionApp.launch_instance()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def test_jupyterlab_lists_the_extension_enabled_with_the_python_version():
    listing = _labextension_list()
    line = next((line for line in listing.splitlines() if line.strip().startswith(NAME + " ")), None)
    assert line is not None, (
        f"`jupyter labextension list` does not show {NAME}; install with `pip install -e \".[dev]\"` "
        f"(it builds lab_extension/ with npm). Listing:\n{listing}")
    assert f"{NAME} v{torch_adapter.__version__} enabled OK" in line, line
    assert "(python, torch-adapter)" in line, line
