"""The torch range the project claims is the one it is tested with."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _torch_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == "torch")


def test_the_torch_under_test_is_in_the_claimed_range():
    spec = _torch_requirement().specifier
    assert Version(torch.__version__.split("+")[0]) in spec, (torch.__version__, str(spec))
    # the range is no wider than the minor version tested here
    tested = Version(torch.__version__.split("+")[0])
    assert Version(f"{tested.major}.{tested.minor - 1}.99") not in spec
    assert Version(f"{tested.major}.{tested.minor + 1}.0") not in spec


def test_the_readme_quotes_the_same_range():
    spec = str(_torch_requirement().specifier)
    readme = (ROOT / "README.md").read_text()
    quoted = re.findall(r"`torch([<>=!~][^`]*)`", readme)
    assert quoted, "README.md names the torch range in backticks"
    assert all(Requirement("torch" + q).specifier == _torch_requirement().specifier for q in quoted), (quoted, spec)
