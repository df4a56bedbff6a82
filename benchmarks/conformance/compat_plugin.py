"""pytest plugin (both runs, plain and adapted): the stored test files are newer than torch 2.13's
own test helpers (``torch.testing._internal``, shipped in the wheel). Two differences stop them at
import; this plugin bridges exactly those, identically for the plain and the adapted run, so the
comparison is unaffected. The test files themselves are never edited.

- ``common_methods_invocations.binary_ufuncs_and_refs`` (newer files import it): in 2.13,
  ``binary_ufuncs`` is already built from ``ops_and_refs``, so it *is* that list.
- ``@skipIfTorchDynamo`` used bare, without a message (newer helpers accept it; 2.13 raises
  "Are you using skipIfTorchDynamo correctly?").

The wide set's files (test_nn.py, test_torch.py from torch 2.6: README.md) are older than the helpers:
three names they import are bridged by :func:`_older_files`.

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
    _older_files()
    original = common_utils.skipIfTorchDynamo
    if getattr(original, "_conformance_compat", False):
        return

    def skipIfTorchDynamo(msg="test doesn't currently work with dynamo"):  # noqa: N802 - torch's name
        if callable(msg) and not isinstance(msg, str):  # used bare: @skipIfTorchDynamo
            return original()(msg)
        return original(msg)

    skipIfTorchDynamo._conformance_compat = True
    common_utils.skipIfTorchDynamo = skipIfTorchDynamo


def _older_files():
    """Names the 2.6 test files (test_nn.py, test_torch.py; README.md: where they come from) import
    and torch 2.13's helpers renamed or dropped, each given the 2.13 equivalent."""
    import torch
    from torch.testing._internal import common_cuda, common_mkldnn, common_nn

    if not hasattr(common_nn, "new_module_tests"):  # 2.13 builds the list on demand
        common_nn.new_module_tests = common_nn.get_new_module_tests()
    if not hasattr(common_cuda, "tf32_is_not_fp32"):
        def tf32_is_not_fp32():  # 2.6: CUDA >= 11 on an Ampere-or-newer device; 2.13's tf32_on_and_off asks this
            return torch.cuda.is_tf32_supported()

        common_cuda.tf32_is_not_fp32 = tf32_is_not_fp32
    if not hasattr(common_mkldnn, "bf32_on_and_off"):  # 2.13: bf32 and tf32 on the CPU in one decorator
        def bf32_on_and_off(bf32_precision=1e-2):
            return common_mkldnn.reduced_f32_on_and_off(bf32_precision=bf32_precision)

        common_mkldnn.bf32_on_and_off = bf32_on_and_off
