"""pytest plugin: install torch_adapter before collection (``pytest -p adapter_plugin``).

PyTorch's ``instantiate_device_type_tests`` decides at import time of the test module whether
to create the CUDA classes (``torch.cuda.is_available()``), so the adapter must be installed
before the test file is collected: ``pytest_configure`` runs before collection. The session
stays installed for the whole run and is uninstalled at ``pytest_unconfigure``.
"""

from __future__ import annotations

import os


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    import torch_adapter

    torch_adapter.install(os.environ.get("CONFORMANCE_TARGET", "cpu"))


def pytest_unconfigure(config):  # noqa: ARG001
    import torch_adapter

    torch_adapter.uninstall()
