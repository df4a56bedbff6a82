"""pytest plugin: install torch_adapter before collection (``pytest -p adapter_plugin``).

PyTorch's ``instantiate_device_type_tests`` decides at import time of the test module whether
to create the CUDA classes (``torch.cuda.is_available()``), so the adapter must be installed
before the test file is collected: ``pytest_configure`` runs before collection. The session
stays installed for the whole run and is uninstalled at ``pytest_unconfigure``.

``CONFORMANCE_TARGET`` names the target (default ``cpu``); ``CONFORMANCE_EMULATE=1`` runs it on
the project's emulated device (``install(target, emulate=True)``: ``npu``, a real PrivateUse1
device whose memory is host memory). The emulated device stays for the process's life
(PrivateUse1 cannot be renamed back); uninstalling takes the redirection off.
"""

from __future__ import annotations

import os


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    import torch_adapter

    emulate = os.environ.get("CONFORMANCE_EMULATE", "") not in ("", "0")
    torch_adapter.install(os.environ.get("CONFORMANCE_TARGET", "cpu"), emulate=emulate)


def pytest_unconfigure(config):  # noqa: ARG001
    import torch_adapter

    torch_adapter.uninstall()
