"""Build hook: the adapter's C++ parts compiled at install, so that no program or notebook cell does.

``pip install -e .`` (editable) writes them into ``adapter/torch_adapter/_built`` (git-ignored);
a wheel carries them as ``torch_adapter/_built/*.so`` (and so becomes a platform wheel). Each file is
named by a digest of its source and of the torch version it was built against: a session under
another torch ignores it and falls back to torch's extension cache, then to the pure-Python stand-ins
(``torch_adapter.core.cpp_build``).

They are compiled against the torch of the environment being installed into, by that environment's
interpreter (``sys.executable`` with pip's build isolation lifted: its ``PYTHONPATH`` and
``PYTHONNOUSERSITE``), with ninja from the build requirements. No torch there yet, no compiler, or
``TORCH_ADAPTER_BUILD_AT_INSTALL=0``: the install goes on without them and says so; ``torch-adapter
build`` builds them later.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ENV = "TORCH_ADAPTER_BUILD_AT_INSTALL"


class CppPartsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get(ENV, "1").lower() in ("0", "off", "no", "false"):
            self.app.display_info(f"torch_adapter: C++ parts not built at install ({ENV}=0); `torch-adapter build` does it")
            return
        root = Path(self.root)
        if version == "editable":
            into = root / "adapter" / "torch_adapter" / "_built"
        else:
            into = Path(tempfile.mkdtemp(prefix="torch-adapter-built-"))
        if not self._build(root, into):
            return
        if version != "editable":
            for so in sorted(into.glob("*.so")):
                build_data["force_include"][str(so)] = f"torch_adapter/_built/{so.name}"
            build_data["pure_python"] = False
            build_data["infer_tag"] = True

    def _build(self, root: Path, into: Path) -> bool:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
        env["PYTHONPATH"] = str(root / "adapter")
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], env=env,
                               capture_output=True, text=True, cwd=tempfile.gettempdir())
        if probe.returncode != 0:
            self.app.display_warning("torch_adapter: C++ parts not built at install: torch is not installed in this "
                                     "environment yet (install torch first, or run `torch-adapter build` after); "
                                     "until then sessions use the pure-Python stand-ins")
            return False
        self.app.display_info(f"torch_adapter: building the C++ parts for torch {probe.stdout.strip()} "
                              "(about a minute, once per torch version)...")
        done = subprocess.run([sys.executable, "-m", "torch_adapter", "build", "--into", str(into)], env=env,
                              capture_output=True, text=True, cwd=tempfile.gettempdir())
        for line in (done.stdout + done.stderr).splitlines():
            if line.strip():
                self.app.display_info(f"  {line}")
        if done.returncode != 0:
            self.app.display_warning("torch_adapter: some C++ parts did not build at install (above); the install goes "
                                     "on: sessions use the pure-Python stand-ins and `torch-adapter build` retries")
        return any(into.glob("*.so"))
