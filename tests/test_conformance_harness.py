"""The conformance harness (benchmarks/conformance/run.py) on a small device-generic test file
this test writes itself: real ``instantiate_device_type_tests``, the real adapter installed
before collection by the harness's plugin, both runs in fresh interpreters. Checks the matching
(CPU-plain <-> CUDA-adapted), the classification rules and the CPU-unchanged check."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = '''
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, dtypes
from torch.testing._internal.common_utils import TestCase


class TestSynthetic(TestCase):
    @dtypes(torch.float32, torch.int64)
    def test_add(self, device, dtype):
        x = torch.ones(3, device=device, dtype=dtype)
        self.assertEqual((x + x).tolist(), [2, 2, 2])

    def test_cross_device_error(self, device):
        x = torch.ones(3, device=device)
        if self.device_type == "cuda":
            with self.assertRaisesRegex(RuntimeError, "on the same device"):
                torch.nonzero(x, out=torch.empty([], dtype=torch.long))

    def test_result_device(self, device):
        self.assertEqual(torch.ones(1, device=device).device, torch.device(device))

    def test_unknown_breakage(self, device):
        if self.device_type == "cuda":
            raise ValueError("something the rules do not know")


instantiate_device_type_tests(TestSynthetic, globals(), only_for=("cpu", "cuda"))
'''


def _harness():
    spec = importlib.util.spec_from_file_location("conformance_run", ROOT / "benchmarks" / "conformance" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_harness_matches_and_classifies(tmp_path):
    run = _harness()
    (tmp_path / "test_synthetic.py").write_text(textwrap.dedent(SYNTHETIC))
    out = tmp_path / "conformance.json"
    # -k selects nothing; --file-k replaces it for this file (the wide set's per-file selection)
    assert run.main([str(tmp_path), "--files", "test_synthetic.py", "--json", str(out), "--timeout", "120",
                     "-k", "no_such_test", "--file-k", "test_synthetic.py=test_"]) == 0
    import json

    res = json.loads(out.read_text())["results"][0]
    assert "error" not in res, res
    assert (res["tests"], res["cpu_pass"], res["cuda_pass"]) == (5, 5, 2)
    by_test = {f["test"]: (f["class"], f["kind"]) for f in res["failures"]}
    assert by_test == {
        "TestSyntheticCUDA::test_cross_device_error_cuda":
            ("expects a cross-device error that cannot happen on one device", run.BY_DESIGN),
        "TestSyntheticCUDA::test_result_device_cuda": ("asserts the result's device is cuda", run.BY_DESIGN),
        "TestSyntheticCUDA::test_unknown_breakage_cuda": run.OTHER,
    }
    assert res["cpu_changed"] == []
    assert (res["by_design"], res["defects"]) == (2, 1)
    assert res["percent"] == round(100 * 2 / (5 - 2), 2)


def test_rules_need_their_context():
    run = _harness()
    assert run.classify("AssertionError: RuntimeError not raised by <lambda>\n  'on the same device'")[1] == run.BY_DESIGN
    assert run.classify("AssertionError: RuntimeError not raised by <lambda>\n  'a value error'") == run.OTHER
    nondet = "AssertionError: RuntimeError not raised : expected a non-deterministic error, but it was not raised"
    assert run.classify(nondet)[1] == run.BY_DESIGN
    scaler = "AssertionError: False is not true\n    self.assertTrue(a._scale.device.type == device.type)"
    assert run.classify(scaler) == ("asserts the result's device is cuda", run.BY_DESIGN)
    assert run.classify("AssertionError: False is not true\n    self.assertTrue(ok)") == run.OTHER
    assert set(run.WIDE_FILES) == {"test_modules.py", "test_optim.py", "test_nn.py", "test_torch.py"}


def test_emulated_rules_drop_the_one_device_classes():
    """On the emulated npu (run.py --target npu --emulate) the device is distinct from the CPU: the
    one-device classes are not applied; only the naming rule (npu:i where the test wrote cuda:i) and the
    empty quantized backend are by design there. A result left on the CPU is a defect."""
    run = _harness()
    rules = run.rules_for("npu", emulate=True)
    assert run.rules_for("cpu") is run.RULES
    naming = run.classify("AssertionError: Object comparison failed: device(type='npu', index=0) != "
                          "device(type='cuda', index=0)", rules)
    assert naming[1] == run.BY_DESIGN and "named cuda" in naming[0]
    assert run.classify("AssertionError: String comparison failed: 'cuda' != 'npu'", rules)[1] == run.BY_DESIGN
    assert run.classify('AssertionError: "from device \'cuda:0\' to \'cpu\'" does not match "can\'t alias tensor '
                        'from device \'npu:0\' to \'cpu\'."', rules)[1] == run.BY_DESIGN
    # another index, or a result on the CPU, is not a naming difference
    assert run.classify("AssertionError: device(type='npu', index=0) != device(type='cuda', index=1)", rules) == run.OTHER
    assert run.classify("AssertionError: device(type='cpu') != device(type='cuda', index=0)", rules) == run.OTHER
    # the cross-device error must happen there
    assert run.classify("AssertionError: RuntimeError not raised by <lambda>\n  'on the same device'", rules) == run.OTHER
    assert run.classify("NotImplementedError: Could not run 'aten::_empty_affine_quantized' with arguments from "
                        "the 'Quantizednpu' backend.", rules)[1] == run.BY_DESIGN
    # boolean device comparisons (test_modules' test_to/test_to_empty, test_torch's GradScaler) name the device
    for text in ("AssertionError: False is not true\n    self.assertTrue(a._scale.device.type == device.type)",
                 "AssertionError: False is not true\n    self.assertTrue(all(p.device.type == device_ for p in "
                 "m.parameters()))",
                 "AssertionError: False is not true\n    self.assertTrue(mw._base[0][0].device.type == \"cuda\")",
                 "AssertionError: False is not true\n    self.assertTrue(packed.is_cuda)"):
        assert "named cuda" in run.classify(text, rules)[0], text
    assert run.classify("AssertionError: False is not true\n    self.assertTrue(ok)", rules) == run.OTHER
    assert run.classify("TypeError: map_ is only implemented on CPU tensors", rules)[1] == run.BY_DESIGN
    # a module left on the CPU with inputs on the device: the device's kernel reports the mixing first
    mixed = ('AssertionError: "Expected tensor for argument.*indices" does not match "Expected all tensors to be '
             'on the same device, but got indices is on npu:0, different from other tensors on cpu (when checking '
             'argument in method wrapper_npu_aten::embedding)"')
    assert run.classify(mixed, rules) == (run.MIXED_INPUT_CLASS, run.BY_DESIGN)
    assert run.classify(mixed, run.RULES) == run.OTHER  # on the CPU target nothing can mix
    fast = ("AssertionError: False is not true\n            fast_path_device = result.is_cuda or result.is_cpu\n"
            "            self.assertTrue(not np.isnan(result).any())")
    assert run.classify(fast, rules) == (run.FAST_PATH_CLASS, run.BY_DESIGN)
