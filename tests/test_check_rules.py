"""Every built-in check rule has a positive and a negative case (a new rule without cases
fails here), plus the rule format's validation, user rule files and per-target wording."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_adapter.check.discover import Source
from torch_adapter.check.engine import Checker
from torch_adapter.check.rules import RULES
from torch_adapter.check.ruleset import build_ruleset, load_rule_file, rule_from_dict
from torch_adapter.check.textscan import language_of
from torch_adapter.errors import CheckError

# rule id -> (file name, code that must hit on the line marked "<-", code that must not hit
#            [, file name for the negative case])
P = "case.py"
CASES: dict[str, tuple[str, ...]] = {
    "AMP001": (P, "from torch.cuda.amp import autocast\nwith autocast():  # <-\n    pass",
               "with torch.autocast('cpu'):\n    pass"),
    "AMP002": (P, "s = torch.cuda.amp.GradScaler()  # <-", "s = torch.amp.GradScaler('cuda')"),
    "AMP003": (P, "@torch.cuda.amp.custom_fwd  # <-\ndef f(ctx, x):\n    pass",
               "@torch.amp.custom_fwd(device_type='cuda')\ndef f(ctx, x):\n    pass"),
    "AMP004": (P, "from torch.cuda.amp import GradScaler  # <-", "from torch.amp import GradScaler"),
    "AMP005": (P, "with torch.autocast(device_type='cuda'):  # <-\n    pass",
               "with torch.autocast(device_type='cpu'):\n    pass"),
    "AMP008": (P, "with torch.autocast(device_type=x.device.type):  # <-\n    pass", "with ctx:\n    pass"),
    "AMP006": (P, "s = torch.amp.GradScaler()  # <-", "s = torch.cuda.amp.GradScaler()"),
    "AMP007": (P, "s = torch.amp.GradScaler()\ns.step(opt)  # <-", "s = make()\ns.step(opt)"),
    "API001": (P, "ok = torch.cuda.is_available()  # <-", "ok = torch.backends.mps.is_available()"),
    "API002": (P, "n = torch.cuda.device_count()  # <-", "n = torch.xpu.device_count()"),
    "API003": (P, "torch.cuda.set_device(0)  # <-", "torch.set_default_device('cpu')"),
    "API004": (P, "torch.cuda.synchronize()  # <-", "torch.cpu.synchronize()"),
    "API005": (P, "torch.cuda.manual_seed_all(0)  # <-", "torch.manual_seed(0)"),
    "API006": (P, "torch.cuda.empty_cache()  # <-", "torch.mps.empty_cache()"),
    "API007": (P, "e = torch.cuda.Event(enable_timing=True)  # <-", "e = threading.Event()"),
    "API008": (P, "e = torch.cuda.Event(enable_timing=True)\ne.record()  # <-", "e = threading.Event()\ne.record()"),
    "API009": (P, "torch.cuda.nvtx.range_push('a')  # <-", "torch.profiler.record_function('a')"),
    "API010": (P, "g = torch.cuda.CUDAGraph()  # <-", "g = build_graph()"),
    "API011": (P, "v = torch.version.cuda  # <-", "v = torch.version.__version__"),
    "API012": (P, "t = torch.cuda.FloatTensor(3)  # <-", "t = torch.FloatTensor(3)"),
    "API013": (P, "f = torch.cuda.jiterator._create_jit_fn('x')  # <-", "f = torch.jit.freeze(m)"),
    "API014": (P, "torch.backends.cudnn.benchmark = True  # <-", "torch.backends.mkldnn.enabled = True"),
    "API015": (P, "torch.backends.cuda.enable_flash_sdp(False)  # <-", "torch.backends.mps.is_available()"),
    "API016": (P, "with torch.backends.cuda.sdp_kernel(enable_math=False):  # <-\n    pass",
               "with torch.nn.attention.sdpa_kernel([SDPBackend.MATH]):\n    pass"),
    "API017": (P, "torch.backends.cuda.matmul.allow_tf32 = True  # <-", "torch.backends.mkldnn.enabled = False"),
    "API018": (P, "from torch.nn.attention import SDPBackend\nb = SDPBackend.FLASH_ATTENTION  # <-",
               "from torch.nn.attention import SDPBackend\nb = SDPBackend.MATH"),
    "API019": (P, "torch.set_float32_matmul_precision('high')  # <-", "torch.set_default_dtype(torch.float32)"),
    "API020": (P, "from torch.profiler import ProfilerActivity\nacts = [ProfilerActivity.CUDA]  # <-",
               "from torch.profiler import ProfilerActivity\nacts = [ProfilerActivity.CPU]"),
    "API021": (P, "print(p.key_averages().table(sort_by='cuda_time_total'))  # <-",
               "print(p.key_averages().table(sort_by='self_cpu_time_total'))"),
    "DEV001": (P, "x = x.cuda()  # <-", "x = x.cpu()"),
    "DEV002": (P, "x = x.to('cuda:1')  # <-", "x = x.to('cpu')"),
    "DEV003": (P, "d = torch.device('cuda', 0)  # <-", "d = torch.device('cpu')"),
    "DEV004": (P, "x = torch.zeros(3, device='cuda')  # <-", "x = torch.zeros(3, device=dev)"),
    "DEV005": (P, "dl = DataLoader(ds, pin_memory=True)  # <-", "dl = DataLoader(ds, pin_memory=False)"),
    "DEV006": (P, "y = x.to(dev, non_blocking=True)  # <-", "y = x.to(dev)"),
    "DEV007": (P, "m = torch.nn.DataParallel(m)  # <-", "m = torch.nn.parallel.DistributedDataParallel(m)"),
    "DEV008": (P, "m = DDP(m, device_ids=[rank])  # <-", "m = DDP(m)"),
    "DEV009": (P, "if x.is_cuda:  # <-\n    pass", "if x.is_cpu:\n    pass"),
    "DEV010": (P, "if x.device.type == 'cuda':  # <-\n    pass", "if x.device.type == 'cpu':\n    pass"),
    "DEV011": (P, "dev = 'cuda'  # <-", "dev = 'cpu'"),
    "DIST001": (P, "import torch.distributed as dist\ndist.init_process_group('nccl')  # <-",
                "import torch.distributed as dist\ndist.init_process_group('gloo')"),
    "DIST002": (P, "launcher(backend='nccl')  # <-", "launcher(backend='gloo')"),
    "DIST003": (P, "if dist.get_backend() == 'nccl':  # <-\n    pass", "if dist.get_backend() == 'gloo':\n    pass"),
    "DIST004": (P, "import torch.distributed as dist\nok = dist.is_nccl_available()  # <-",
                "import torch.distributed as dist\nok = dist.is_gloo_available()"),
    "DIST005": (P, "BACKENDS = ['nccl']  # <-", "BACKENDS = ['gloo']"),
    "DIST006": (P, "net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)  # <-", "net = torch.nn.BatchNorm2d(8)"),
    "ENV001": (P, "os.environ['CUDA_VISIBLE_DEVICES'] = '0'  # <-", "os.environ['OMP_NUM_THREADS'] = '1'"),
    "ENV002": (P, "os.environ['CUDA_LAUNCH_BLOCKING'] = '1'  # <-", "os.environ['TORCH_SHOW_CPP_STACKTRACES'] = '1'"),
    "ENV003": (P, "os.environ['NCCL_DEBUG'] = 'INFO'  # <-", "os.environ['GLOO_SOCKET_IFNAME'] = 'eth0'"),
    "ENV004": (P, "home = os.environ.get('CUDA_HOME')  # <-", "home = os.environ.get('HOME')"),
    "ENV005": (P, "subprocess.run(['nvidia-smi'])  # <-", "subprocess.run(['ls'])"),
    "NUM001": (P, "x = torch.zeros(3, dtype=torch.float64)  # <-", "x = torch.zeros(3, dtype=torch.float32)"),
    "JIT001": (P, "f = torch.jit.script(f)  # <-", "f = torch.jit.trace(f, x)"),
    "JIT002": (P, "torch._C._jit_set_nvfuser_enabled(False)  # <-", "m = torch.jit.freeze(m)"),
    "JIT003": (P, "m = torch.compile(m, mode='reduce-overhead')  # <-", "m = torch.compile(m)"),
    "JIT004": (P, "m = torch.compile(m)  # <-", "m = torch.compile(m, mode='max-autotune')"),
    "JIT005": (P, "m = torch.jit.load('m.pt')  # <-", "m = torch.load('m.pt')"),
    "EIN001": (P, "y = torch.einsum('ij,jk->ik', a, b)  # <-", "y = a @ b"),
    "EXT001": (P, "from torch.utils.cpp_extension import CUDAExtension\next = CUDAExtension('x', ['a.cpp'])  # <-",
               "from torch.utils.cpp_extension import CppExtension\next = CppExtension('x', ['a.cpp'])"),
    "EXT002": (P, "m = load_inline('m', cpp_sources=s, cuda_sources=c)  # <-", "m = load_inline('m', cpp_sources=s)"),
    "EXT003": (P, "srcs = ['ops.cpp', 'kernel.cu']  # <-", "srcs = ['ops.cpp', 'kernel.cpp']"),
    "EXT004": (P, "from torch.utils.cpp_extension import CUDA_HOME  # <-",
               "from torch.utils.cpp_extension import CppExtension"),
    "EXT005": (P, "@torch.library.register_kernel('mylib::op', 'cuda')  # <-\ndef f(x):\n    return x",
               "@torch.library.register_kernel('mylib::op', 'cpu')\ndef f(x):\n    return x"),
    "LIB001": (P, "from flash_attn import flash_attn_func  # <-",
               "from torch.nn.functional import scaled_dot_product_attention"),
    "LIB002": (P, "import xformers.ops as xops  # <-", "import torch.nn.functional as F"),
    "LIB003": (P, "from apex import amp  # <-", "from torch import amp"),
    "LIB004": (P, "from apex.optimizers import FusedAdam\nopt = FusedAdam(ps)  # <-",
               "opt = torch.optim.AdamW(ps, fused=True)"),
    "LIB005": (P, "from apex.normalization import FusedRMSNorm\nn = FusedRMSNorm(8)  # <-", "n = torch.nn.RMSNorm(8)"),
    "LIB006": (P, "import apex  # <-", "import apexlib"),
    "LIB007": (P, "import bitsandbytes as bnb  # <-", "import torchao"),
    "LIB008": (P, "m = load(name, load_in_8bit=True)  # <-", "m = load(name, load_in_8bit=False)"),
    "LIB009": (P, "import cupy as cp  # <-", "import numpy as np"),
    "LIB010": (P, "import pynvml  # <-", "import psutil"),
    "LIB011": (P, "import triton\n@triton.jit  # <-\ndef k(x):\n    pass", "import functools\n@functools.cache\ndef k(x):\n    pass"),
    "LIB012": (P, "from numba import cuda  # <-", "from numba import jit"),
    "LIB014": (P, "trainer = pl.Trainer(accelerator='gpu', devices=2)  # <-",
               "trainer = pl.Trainer(accelerator='auto', devices=2)"),
    "LIB015": (P, "pipe.enable_xformers_memory_efficient_attention()  # <-", "pipe.enable_attention_slicing()"),
    "LIB016": (P, "m = AutoModel.from_pretrained(n, attn_implementation='flash_attention_2')  # <-",
               "m = AutoModel.from_pretrained(n, attn_implementation='sdpa')"),
    "LIB013": (P, "import nvtx  # <-", "import logging"),
    "SRC001": ("kernel.cu", "// <-\n__global__ void k() {}", "int main() { return 0; }", "main.cpp"),
    "SRC002": ("kernel.cu", "__global__ void k() {}  // <-", "void k() {}"),
    "SRC003": ("ops.cpp", "TORCH_LIBRARY_IMPL(ns, CUDA, m) {}  // <-", "TORCH_LIBRARY_IMPL(ns, CPU, m) {}"),
    "SRC004": ("ops.cpp", "#include <cuda_runtime.h>  // <-", "#include <vector>"),
    "SRC005": ("ops.cpp", "TORCH_CHECK(x.is_cuda());  // <-", "TORCH_CHECK(x.is_cpu());"),
    "TXT001": ("run.sh", "export CUDA_VISIBLE_DEVICES=0  # <-", "export OMP_NUM_THREADS=4"),
    "TXT002": ("requirements.txt", "flash-attn==2.5.8  # <-", "numpy==1.26"),
    "TXT003": ("requirements.txt", "torch==2.3.0+cu121  # <-", "torch==2.3.0"),
    "TXT004": ("run.sh", "export NCCL_DEBUG=INFO  # <-", "export GLOO_SOCKET_IFNAME=eth0"),
    "ANY001": (P, "b = torch.cuda.get_allocator_backend()  # <-", "b = torch.mps.driver_allocated_memory()"),
    "ANY002": (P, "use_cuda = flag  # <-", "use_gpu = flag"),
    "ANY003": (P, "print('running on CUDA')  # <-", "print('running on the GPU')"),
    "ANY004": ("run.sh", "echo using cuda  # <-", "echo using gpu"),
    "ANY006": (P, "if is_xformers_available():  # <-\n    pass", "if is_sdpa_available():\n    pass"),
    "ANY005": ("broken.py", "def f(:\n    x.cuda()  # <-", "def f(:\n    x.cpu()"),
}

RULE_IDS = [r["id"] for r in RULES]


@pytest.fixture(scope="module")
def checkers():
    rs = build_ruleset()
    cache: dict[str, Checker] = {}

    def get(target: str = "any") -> Checker:
        if target not in cache:
            cache[target] = Checker(rs, target)
        return cache[target]

    return get


def findings_for(tmp_path: Path, checker: Checker, name: str, code: str):
    path = tmp_path / name
    path.write_text(code + "\n", encoding="utf-8")
    return checker.check(Source(str(path), name, language_of(name), path.stat().st_size)).findings


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_rule_has_cases(rule_id):
    assert rule_id in CASES, f"rule {rule_id} has no positive/negative case in tests/test_check_rules.py CASES"


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_rule_positive(rule_id, tmp_path, checkers):
    name, hit = CASES.get(rule_id, (P, ""))[:2]
    if not hit:
        pytest.fail(f"no case for {rule_id}")
    line = next(i for i, text in enumerate(hit.split("\n"), 1) if "<-" in text)
    found = findings_for(tmp_path, checkers(), name, hit)
    assert any(f.rule_id == rule_id and f.start_line == line for f in found), \
        f"{rule_id} not at line {line}: {[(f.rule_id, f.start_line) for f in found]}"


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_rule_negative(rule_id, tmp_path, checkers):
    case = CASES.get(rule_id, (P, "", ""))
    name, miss = (case[3] if len(case) > 3 else case[0]), case[2]
    found = findings_for(tmp_path, checkers(), name, miss)
    assert not [f for f in found if f.rule_id == rule_id]


def test_no_stale_cases():
    assert not set(CASES) - set(RULE_IDS), "CASES names rules that do not exist"


def test_builtin_rules_keep_the_fast_path():
    rs = build_ruleset()
    assert not rs.python_always, "a Python rule without literal triggers makes check parse every file"
    assert all(t for t in rs.python_triggers)
    for lang in ("cuda", "cxx", "shell", "config", "python-text"):
        assert rs.text_triggers[lang] is not None, f"{lang}: a text rule without triggers"


def test_messages_name_the_target(tmp_path, checkers):
    code = "import torch.distributed as dist\nx = x.cuda()\ndist.init_process_group('nccl')\n"
    npu = {f.rule_id: f for f in findings_for(tmp_path, checkers("npu"), P, code)}
    assert '.to("npu:0")' in npu["DEV001"].message
    assert '"hccl"' in npu["DIST001"].message
    cpu = {f.rule_id: f for f in findings_for(tmp_path, checkers("cpu"), P, code)}
    assert '.to("cpu")' in cpu["DEV001"].message and '"gloo"' in cpu["DIST001"].message
    amp = findings_for(tmp_path, checkers("cpu"), P, "with torch.autocast('cuda'):\n    pass")
    assert "float16, the dtype the code asks for" in amp[0].message and "amp_dtype='bfloat16'" in amp[0].message
    generic = {f.rule_id: f for f in findings_for(tmp_path, checkers(), P, code)}
    assert "<target>:0" in generic["DEV001"].message and "{" not in generic["DEV001"].message


def test_severity_depends_on_target(tmp_path, checkers):
    code = "import triton\n@triton.jit\ndef k(x):\n    pass\nx = torch.zeros(1, dtype=torch.float64)"
    sev = {t: {f.rule_id: f.severity for f in findings_for(tmp_path, checkers(t), P, code)}
           for t in ("any", "cuda", "xpu", "cpu", "mps")}
    assert sev["any"]["LIB011"] == "unsupported" and sev["cuda"]["LIB011"] == "handled"
    assert sev["xpu"]["LIB011"] == "review"
    assert sev["mps"]["NUM001"] == "unsupported" and sev["any"]["NUM001"] == "review"
    assert "NUM001" not in sev["cpu"], "float64 is only a problem on mps"


def _rule(**over):
    base = {"id": "ORG001", "severity": "review", "match": {"call": ["mylib.gpu_only"]}, "message": "m"}
    base.update(over)
    return base


@pytest.mark.parametrize("over, pattern", [
    ({"id": "bad id"}, r"id: upper-case letters"),
    ({"severity": "fatal"}, r"severity: one of handled, review, unsupported.*'fatal'"),
    ({"colour": "red"}, r"unknown rule key"),
    ({"match": {"calls": ["x"]}}, r"unknown key 'calls'"),
    ({"match": {}}, r"no matcher kind given"),
    ({"match": {"string": "("}}, r"(?s)string: a valid regular expression.*Why: "),
    ({"match": {"call": ["not a name"]}}, r"call: dotted names"),
    ({"message": "runs on {gpu}"}, r"unknown placeholder \{gpu\}"),
    ({"message": "a } brace"}, r"balanced braces"),
    ({"severity_by_target": {"npu": "bad"}}, r"severity_by_target.npu"),
    ({"rewrite": {"replace": "x"}}, r"rewrite: a table with builtin"),
    ({"match": {"regex": "x", "languages": ["fortran"]}}, r"languages among"),
    ({"match": {"keyword": ["device"]}}, r"keyword: a table name"),
    ({"match": "torch.cuda"}, r"match: a table of matcher kinds"),
    ({"match": {"call": []}}, r"call: a non-empty list of strings"),
    ({"match": {"instance": {"classes": ["a.B"]}}}, r"instance: a table with classes and methods"),
    ({"match": {"file": ["cu"]}, "severity": "review"}, r"file: extensions starting with a dot"),
    ({"match": {"call": ["a.b"], "where": [{"regex": "x"}]}}, r"where: a list of \{arg = N"),
    ({"rewrite": {"sub": ["only-pattern"]}}, r"rewrite.sub: \[PATTERN, REPLACEMENT\]"),
    ({"targets": "mps"}, None),  # a single string is accepted as a list
    ({"targets": 3}, r"targets: a non-empty list of strings"),
])
def test_rule_validation_errors(over, pattern):
    if pattern is None:
        assert rule_from_dict(_rule(**over), source="rules.toml").targets == ("mps",)
        return
    with pytest.raises(CheckError, match=pattern):
        rule_from_dict(_rule(**over), source="rules.toml")


def test_a_rule_must_be_a_table():
    with pytest.raises(CheckError, match=r"check rule '\?' \(rules.toml\): expected a rule table, got 'x' \(str\)"):
        rule_from_dict("x", source="rules.toml")


def test_duplicate_rule_id_is_an_error():
    with pytest.raises(CheckError, match=r"check rule 'DEV001' \(mine.toml\).*also defined in built-in"):
        build_ruleset([("mine.toml", [_rule(id="DEV001")])])


USER_RULES = '''
[[rule]]
id = "ORG001"
title = "our GPU helper"
severity = "unsupported"
message = "gpu_only() calls a CUDA kernel; nothing runs on {target}"
alternative = "mylib.portable()"
docs = "https://example.invalid/gpu_only"
match = { call = ["mylib.gpu_only"] }
rewrite = { sub = ["gpu_only", "portable"] }

[[rule]]
id = "ORG002"
severity = "review"
message = "a project flag"
match = { regex = "USE_GPU_KERNELS", languages = ["shell", "config"] }
'''


def test_user_rules_from_toml(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(USER_RULES)
    rs = build_ruleset([(str(rules), load_rule_file(rules))])
    checker = Checker(rs, "npu")
    found = findings_for(tmp_path, checker, P, "import mylib\ny = mylib.gpu_only(x)")
    (f,) = [f for f in found if f.rule_id == "ORG001"]
    assert f.severity == "unsupported" and "nothing runs on npu" in f.message and f.start_line == 2
    assert "+y = mylib.portable(x)" in f.rewrite
    sh = findings_for(tmp_path, checker, "run.sh", "export USE_GPU_KERNELS=1")
    assert [x.rule_id for x in sh] == ["ORG002"]


@pytest.mark.parametrize("text, pattern", [
    ("[[rule]\nid=1", r"valid UTF-8 TOML"),
    ("title = 'no rules'", r"one or more \[\[rule\]\] tables"),
])
def test_rule_file_errors(tmp_path, text, pattern):
    p = tmp_path / "rules.toml"
    p.write_text(text)
    with pytest.raises(CheckError, match=pattern):
        load_rule_file(p)


def test_missing_rule_file(tmp_path):
    with pytest.raises(CheckError, match=r"(?s)a readable (UTF-8 )?TOML file.*Fix: check the path"):
        load_rule_file(tmp_path / "absent.toml")
