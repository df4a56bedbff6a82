"""A simulated target's dtypes behave as the real backend's: the preview refuses what a real
MPS / Arc GPU refuses, with its exception class and message, at the user's line — or records
every such call and goes on. Each row of TABLE names the source of its fact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_adapter
from torch_adapter.errors import ProfileError, UnsupportedDtypeError
from torch_adapter.routing import profiles

EMPTY_CPP = "pytorch aten/src/ATen/mps/EmptyTensor.cpp empty_mps (MPS_ERROR_DOUBLE_NOT_SUPPORTED)"
OPUTILS = "pytorch aten/src/ATen/native/mps/OperationUtils.mm getMPSDataType / checkSupportsBFloat16 / checkSupportsComplex"
ARC = "intel/torch-xpu-ops#1742 (Arc A770, torch 2.7.1+xpu)"
ALL = "CUDA/CPU dispatch macros include Double and ComplexDouble"
SCALER_MPS = "torch/amp/grad_scaler.py unscale_: float64 inverse scale except on mps:0"
SCALER_ARC = "pytorch/pytorch#147731 (GradScaler does not work on Arc: no fp64)"


def _scaler_step():
    model = torch.nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    scaler.scale(model(torch.ones(2, 4, device="cuda")).sum()).backward()
    scaler.step(opt)


def _ones(dtype):
    return lambda: torch.ones(3, dtype=dtype, device="cuda")


# (target, dtype, how the program makes it, expected exception or None, message start, source)
TABLE = [
    ("mps", "float64", _ones(torch.float64), TypeError, "Cannot convert a MPS Tensor to float64 dtype", EMPTY_CPP),
    ("mps", "float64", lambda: torch.ones(3, device="cuda").double(), TypeError, "Cannot convert a MPS Tensor", EMPTY_CPP),
    ("mps", "float64", lambda: torch.ones(3, device="cuda").sum(dtype=torch.float64), TypeError, "Cannot convert",
     EMPTY_CPP),
    ("mps", "float64", lambda: torch.from_numpy(np.ones(3)).cuda(), TypeError, "Cannot convert", EMPTY_CPP),
    ("mps", "float64", lambda: torch.nn.Linear(2, 2).double().cuda(), TypeError, "Cannot convert", EMPTY_CPP),
    ("mps", "complex128", _ones(torch.complex128), TypeError, "Trying to convert ComplexDouble to the MPS backend",
     OPUTILS),
    ("mps", "float32", _ones(torch.float32), None, "", EMPTY_CPP),
    ("mps", "float16", _ones(torch.float16), None, "", EMPTY_CPP),
    ("mps", "bfloat16", _ones(torch.bfloat16), None, "", OPUTILS + " (macOS 14+)"),
    ("mps", "complex64", _ones(torch.complex64), None, "", OPUTILS + " (macOS 14+)"),
    ("mps-macos13", "bfloat16", _ones(torch.bfloat16), TypeError, "MPS bfloat16 type is supported on MacOS 14.0",
     OPUTILS),
    ("mps-macos13", "complex64", _ones(torch.complex64), TypeError, "MPS complex types are only supported on MacOS 14",
     OPUTILS),
    ("xpu-arc", "float64", _ones(torch.float64), RuntimeError, "Required aspect fp64 is not supported on the device",
     ARC),
    ("xpu-arc", "complex128", _ones(torch.complex128), RuntimeError, "Required aspect fp64", ARC),
    ("xpu-arc", "float32", _ones(torch.float32), None, "", ARC),
    ("xpu", "float64", _ones(torch.float64), None, "", "Data Center GPU Max has fp64"),
    ("mps", "float64", _scaler_step, None, "", SCALER_MPS),
    ("xpu-arc", "float64", _scaler_step, RuntimeError, "Required aspect fp64", SCALER_ARC),
    ("cuda", "float64", _ones(torch.float64), None, "", ALL),
    ("cuda", "complex128", _ones(torch.complex128), None, "", ALL),
]


@pytest.fixture(params=["cpp", "python"])
def backend(request, monkeypatch):
    """The allocation check in C++ (routing/_dtype_guard.cpp) and its Python-kernel fallback."""
    from torch_adapter.routing import dtype_guard

    if request.param == "python":
        monkeypatch.setenv(dtype_guard.ENV, "python")
    elif dtype_guard.load() is None:
        pytest.skip("the C++ dtype guard cannot be built here (no compiler or ninja)")
    return request.param


@pytest.mark.parametrize("target,dtype,make,error,message,source", TABLE,
                         ids=[f"{t}-{d}-{i}" for i, (t, d, *_rest) in enumerate(TABLE)])
def test_the_preview_refuses_what_the_real_target_refuses(target, dtype, make, error, message, source, backend):
    with torch_adapter.adapted(target, simulate=True) as session:
        check = session.routing.dtype_check
        assert check.backend == (backend if check.caps.refused else "")
        if error is None:
            make()
            return
        with pytest.raises(error) as info:
            make()
    assert isinstance(info.value, UnsupportedDtypeError)
    text = str(info.value)
    assert text.startswith(message), text
    assert "Why:" in text and "Fix:" in text and 'dtype_check="record"' in text
    assert any(str(entry.path) == __file__ for entry in info.traceback[1:])  # raised from the user's line


def test_record_mode_lists_every_call_with_its_site_and_goes_on(backend):
    with torch_adapter.adapted("mps", simulate=True, dtype_check="record") as session:
        x = torch.ones(3, dtype=torch.float64, device="cuda")  # line A
        y = (x * 2).sum()
        z = torch.from_numpy(np.ones(2)).cuda()
        print(torch.ones(2, device="cuda"))  # torch's printing picks float32 on a real MPS: not a finding
        log = session.routing.log
        rows = log.dtype_table()
    assert y.item() == 6.0 and z.dtype == torch.float64  # it went on
    assert {r["dtype"] for r in rows} == {"float64"}
    assert {r["op"] for r in rows} >= {"aten::empty.memory_format", "aten::_to_copy"}
    assert all(r["site"] and r["site"]["file"] == __file__ for r in rows)
    assert len({r["site"]["line"] for r in rows}) == 3  # three lines of this test; printing is not one
    data = log.to_dict()["dtypes"]
    assert data["judged"] is True and data["findings"] and "source" in data["findings"][0]
    assert set(log.summary()) == {r.value for r in torch_adapter.Route}  # never a route: no "dtype" key


def test_a_profile_without_dtype_data_says_it_cannot_judge():
    with torch_adapter.adapted("npu", simulate=True) as session:
        torch.ones(3, dtype=torch.float64, device="cuda")  # no data: nothing refused, nothing claimed
        data = session.routing.log.to_dict()["dtypes"]
    assert data["judged"] is False and "cannot judge" in data["note"] and not data["findings"]
    assert profiles.load_profile("npu").dtypes is None


def test_off_checks_nothing_and_uninstall_restores_the_kernels(backend):
    before = torch.library.get_kernel("aten::empty.memory_format", "CPU")
    with torch_adapter.adapted("mps", simulate=True, dtype_check="off"):
        torch.ones(3, dtype=torch.float64, device="cuda")
        torch_adapter.configure(dtype_check="raise")
        with pytest.raises(TypeError):
            torch.ones(3, dtype=torch.float64, device="cuda")
    torch.ones(3, dtype=torch.float64)  # plain torch again
    after = torch.library.get_kernel("aten::empty.memory_format", "CPU")
    assert before.__repr__().split(" at ")[0] == after.__repr__().split(" at ")[0]


def test_a_target_that_refuses_nothing_registers_no_dtype_kernel(backend):
    with torch_adapter.adapted("cuda", simulate=True) as session:
        assert session.routing.dtype_check.backend == ""
    with torch_adapter.adapted("mps", simulate=True) as session:
        assert session.routing.dtype_check.backend == backend


def _write(tmp_path, text):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return str(path)


def test_toml_dtypes_fp64_false_and_per_op(tmp_path):
    path = _write(tmp_path, 'name = "my-gpu"\nbase = "cuda"\n[dtypes]\nfp64 = false\n'
                            '[dtypes.ops]\n"aten::mm" = ["float32"]\n')
    caps = profiles.load_profile(path).dtypes
    assert set(caps.refused) == {"float64", "complex128"}
    assert caps.refusal("float16", "aten::mm") is not None and caps.refusal("float32", "aten::mm") is None
    with torch_adapter.adapted(path, simulate=True):
        with pytest.raises(TypeError, match="my-gpu does not support float64"):
            torch.zeros(2, dtype=torch.float64, device="cuda")
        a = torch.ones(2, 2, device="cuda", dtype=torch.float16)
        with pytest.raises(TypeError, match="aten::mm on cuda does not support float16"):
            torch.mm(a, a)


def test_toml_variant_and_no_data(tmp_path):
    arc = profiles.load_profile(_write(tmp_path, 'name = "a"\nbase = "xpu"\n[dtypes]\nvariant = "arc"\n'))
    assert "float64" in arc.dtypes.refused and arc.dtypes.refused["float64"].error == "RuntimeError"
    bare = profiles.load_profile(_write(tmp_path, 'name = "bare"\nnative = ["aten::add"]\n'))
    assert bare.dtypes is None and "states no dtypes" in bare.dtype_note


@pytest.mark.parametrize("body,key,allowed", [
    ('[dtypes]\nrefuse = ["float65"]\n', "dtypes.refuse", "float64"),
    ('[dtypes]\nvariant = "m1"\n', "dtypes.variant", "fp64, arc"),
    ('[dtypes]\nfp64 = "no"\n', "dtypes.fp64", "true or false"),
    ('[dtypes]\nfloat64 = false\n', "dtypes.float64", "variant"),
    ('[dtypes.ops]\n"aten::mm" = ["f32"]\n', "dtypes.ops.aten::mm", "float32"),
])
def test_toml_errors_name_the_file_the_key_and_the_allowed_values(tmp_path, body, key, allowed):
    path = _write(tmp_path, 'name = "x"\nbase = "xpu"\n' + body)
    with pytest.raises(ProfileError) as info:
        profiles.load_profile(path)
    text = str(info.value)
    assert path in text and repr(key) in text and allowed in text


def test_targets_lists_dtype_capability_and_variants():
    rows = {r["name"]: r for r in torch_adapter.targets() if r["simulated"]}
    assert "float64" in rows["mps"]["details"]["dtypes"]
    assert "cannot judge" in rows["npu"]["details"]["dtypes"]
    assert "xpu-arc" in rows["xpu"]["details"]["variants"]


def test_check_run_lists_refused_dtypes_as_their_own_finding(tmp_path, monkeypatch):
    import json

    from torch_adapter.check.cli import main as check_main

    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(3, device='cuda')\n"
                                       "t = torch.tensor([0.5], dtype=torch.float64).cuda()\nprint((x * t).sum())\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.json"
    code = check_main(["--path", ".", "--target", "mps", "--simulate", "--run", "python train.py",
                       "--output", str(out), "--quiet"])
    data = json.loads(out.read_text())
    assert data["runtime"]["exit_code"] == 0  # recorded, the run went on
    assert code == 1  # a dtype the target refuses will not run there: at or above --fail-on error
    rt3 = {f["start_line"]: f["message"] for f in data["findings"] if f["rule_id"] == "RT003"}
    assert sorted(rt3) == [3, 4]  # the float64 tensor moved to the device, then a promoted float64 result
    assert "dtype float64 not on mps: aten::_to_copy" in rt3[3] and "Cannot convert a MPS Tensor" in rt3[3]
    assert not [f for f in data["findings"] if f["rule_id"] == "RT002"]


def test_coverage_rows_carry_dtype_findings():
    from torch_adapter.coverage.engine import analyse

    with torch_adapter.adapted("mps", simulate=True, dtype_check="record"):
        with torch_adapter.trace(use_observer=False) as log:
            torch.zeros(2, device="cuda").double()
    found = analyse(log)["dtypes"]
    assert found["judged"] and [f["dtype"] for f in found["findings"]] == ["float64"]
    assert sum(analyse(log)["calls"].values()) >= 0 and "dtype" not in analyse(log)["calls"]  # not a route
