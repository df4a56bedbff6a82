"""pytest plugin (both runs, plain and adapted): the stored test files are newer than torch 2.13's
own test helpers (``torch.testing._internal``, shipped in the wheel). Two differences stop them at
import; this plugin bridges exactly those, identically for the plain and the adapted run, so the
comparison is unaffected. The test files themselves are never edited.

- ``common_methods_invocations.binary_ufuncs_and_refs`` (newer files import it): in 2.13,
  ``binary_ufuncs`` is already built from ``ops_and_refs``, so it *is* that list.
- ``@skipIfTorchDynamo`` used bare, without a message (newer helpers accept it; 2.13 raises
  "Are you using skipIfTorchDynamo correctly?").

Runs after the adapter plugin (``trylast``): the helper modules are imported the way a test file
imports them, under the adapter in the adapted run.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    from torch.testing._internal import common_methods_invocations as cmi
    from torch.testing._internal import common_utils

    if not hasattr(cmi, "binary_ufuncs_and_refs"):
        cmi.binary_ufuncs_and_refs = cmi.binary_ufuncs
    original = common_utils.skipIfTorchDynamo
    if getattr(original, "_conformance_compat", False):
        return

    def skipIfTorchDynamo(msg="test doesn't currently work with dynamo"):  # noqa: N802 - torch's name
        if callable(msg) and not isinstance(msg, str):  # used bare: @skipIfTorchDynamo
            return original()(msg)
        return original(msg)

    skipIfTorchDynamo._conformance_compat = True
    common_utils.skipIfTorchDynamo = skipIfTorchDynamo
