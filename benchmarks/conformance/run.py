"""PyTorch's own device-generic tests as a conformance run of torch_adapter (README.md beside this).

For each test file: (1) plain torch -> the CPU classes' outcomes; (2) the adapter installed
before collection (``-p adapter_plugin``) -> CPU and CUDA classes. Each run is a fresh
interpreter with pytest writing JUnit XML. Tests are matched by name (``test_x_cpu_float32`` <->
``test_x_cuda_float32``); every test that passes on CPU-plain but fails under the adapter on
CUDA is classified by :data:`RULES` (data: a regular expression over the failure text -> a
named class, *by design* or *adapter defect*). A CPU-class outcome that changes between the
two runs is listed too (goal: none).

    python benchmarks/conformance/run.py TEST_DIR [--set default|wide] [--files a,b] [-k EXPR]
        [--file-k FILE=EXPR] [--json OUT] [--timeout S] [--write-figures] [--figures-name NAME] [--target npu --emulate]

``--target npu --emulate`` runs the adapted pass on the project's emulated device (a real
PrivateUse1 device, distinct from the CPU): the one-device by-design rules are not applied there
(:func:`rules_for`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_FILES = ("test_view_ops.py", "test_indexing.py", "test_shape_ops.py", "test_sort_and_select.py",
                 "test_binary_ufuncs.py", "test_tensor_creation_ops.py", "test_reductions.py")
# The module-, optimizer-, nn- and tensor/storage-level files (README.md: the selection each run takes).
WIDE_FILES = ("test_modules.py", "test_optim.py", "test_nn.py", "test_torch.py")
FILE_SETS = {"default": DEFAULT_FILES, "wide": WIDE_FILES}
BY_DESIGN, DEFECT = "by design", "adapter defect"

# (class name, kind, regex over the failure message [its first line], regex over the whole
# traceback or None) - first match wins; README.md documents each class once.
Rule = tuple[str, str, str, "str | None"]
RULES: list[Rule] = [
    ("expects a cross-device error that cannot happen on one device", BY_DESIGN,
     r"(RuntimeError|Exception) not raised",
     r"(on the same device|Expected tensor to have .* but got tensor with|_cross_device|test_invalid_device|_mixed_devices)"),
    ("asserts the result's device is cuda", BY_DESIGN,
     r"(device\(type='cpu'\) != device\(type='cuda'|device\(type='cuda', index=0\) != device\(type='cpu'\)"
     r"|'cpu' != 'cuda|'cuda(:0)?' != 'cpu'|is_cuda)", None),
    ("asserts the result's device is cuda", BY_DESIGN,  # assertTrue(p.device == device_), GradScaler's _scale
     r"False is not true", r"\.device(\.type)? == device(_|\.type)\b"),
    ("takes its CUDA branch (torch.cuda.is_available() is True) and expects a second, distinct device", BY_DESIGN,
     r"(not raised|unexpectedly identical)",
     r"(torch\.cuda\.is_available\(\)|get_another_device|_mult_devices|same_device=False|torch\.cuda\.\w+Tensor\(device=)"),
    ("CUDA-only kernel (cuDNN, jiterator, float8 CUDA kernels)", BY_DESIGN,
     r"(jiterator|cudnn|cuDNN|not implemented for 'Float8|not implemented for 'ComplexHalf)", None),
    ("the target's kernel differs from CUDA's by definition (integer division by zero raises on the CPU)",
     BY_DESIGN, r"ZeroDivisionError", r"by_zero"),
    ("the target's kernel is deterministic where CUDA's is not (use_deterministic_algorithms has nothing to refuse)",
     BY_DESIGN, r"expected a non-deterministic error, but it was not raised", None),
    ("expects CUDA's refusal of a dtype the target's kernel supports (uint8 bilinear/bicubic interpolation)",
     BY_DESIGN, r"RuntimeError not raised", r"nonsupported_dtypes"),
    ("a CPU-only tensor method (Tensor.map_, map2_) the test skips for CUDA tensors by is_cuda, which stays "
     "truthful on the target's tensors; a CUDA tensor raises the same TypeError", BY_DESIGN,
     r"map2?_ is only implemented on CPU tensors", None),
    ("the test expects CUDA's kernel to fail (its own xfail for CUDA); the target's kernel passes", BY_DESIGN,
     r"Unexpected success", None),
    ("a once-per-process warning its CPU twin already raised in this interpreter", BY_DESIGN,
     r"Warning not triggered", None),
    ("TorchScript under the adapter (fixed on main, branch jit)", DEFECT, r".", r"torch/jit/"),
    ("stand-in module lacks a name torch.cuda has", DEFECT,
     r"AttributeError: .*(torch\.cuda|'function' object has no attribute)", None),
    ("private torch._C._cuda_* binding missing", DEFECT, r"torch\._C' has no attribute '_cuda", None),
    ("factory not redirected", DEFECT, r"(CUDA|cuda).*(not available|backend|Could not run|not compiled)", None),
]
OTHER = ("unclassified failure", DEFECT)

# By-design classes that hold only where "cuda" *is* the CPU (the CPU target): on a device distinct
# from the CPU (the emulated npu) cross-device errors happen, results are not on the CPU, and the
# device is a second one beside the CPU, so those tests must pass for real.
ONE_DEVICE_ONLY = frozenset({
    "expects a cross-device error that cannot happen on one device",
    "asserts the result's device is cuda",
    "takes its CUDA branch (torch.cuda.is_available() is True) and expects a second, distinct device",
})
# What remains of "the result's device" on a distinct device: the tensor says what it is (npu:0 where
# the test wrote cuda:0, the same index; tensor.device and is_cuda stay truthful, docs/redirect.md);
# a result left on the CPU ('cpu' != 'cuda') is a defect there, not this class.
DEVICE_NAME_CLASS = ("asserts the device is named cuda; it is the target's ({t}:i for cuda:i, the same index: "
                     "tensor.device stays truthful)")


def device_name_rule(target: str) -> Rule:
    """The naming rule for ``target``: the same index under the target's name where the test wrote cuda."""
    t = re.escape(target)
    return (DEVICE_NAME_CLASS.format(t=target), BY_DESIGN,
            rf"(device\(type='{t}', index=(?P<i>\d+)\) != device\(type='cuda', index=(?P=i)\)"
            rf"|device\(type='cuda', index=(?P<j>\d+)\) != device\(type='{t}', index=(?P=j)\)"
            rf"|'{t}(:0)?' != 'cuda(:0)?'|'cuda(:0)?' != '{t}(:0)?'"
            # an expected error text naming cuda where torch's names the device: assertRaisesRegex's mismatch
            rf"|\"[^\"]*'cuda(:\d+)?'[^\"]*\" does not match \"[^\"]*'{t}(:\d+)?'[^\"]*\")", None)


def device_compare_rule(target: str) -> Rule:
    """The naming class where the test compares devices in a boolean (no values in the message):
    test_modules' ``test_to_empty`` asserts ``all(p.device == device_ ...)`` with ``device_ =
    torch.device('cuda:0')``, ``test_to`` ``all(p.device.type == device_ ...)`` with ``device_ = 'cuda'``;
    the parameters are on ``{target}:0`` (checked: ``to_empty(device='cuda:0')`` and ``.to('cuda')`` on the
    emulated npu put every parameter and buffer there)."""
    return (DEVICE_NAME_CLASS.format(t=target), BY_DESIGN, r"^AssertionError: False is not true$",
            r"assertTrue\((all\(p\.device(\.type)? == device_ for p in m\.parameters\(\)\)"
            # test_torch's test_pickle_gradscaler: GradScaler(device="cuda")'s scale is on npu:0
            r"|a\._scale\.device\.type == device\.type"
            # test_nn: a converted parameter's device type, a PackedSequence moved with .to("cuda")
            r"|[\w.\[\]]+\.device\.type == [\"']cuda[\"']|\w+\.is_cuda)\)")


# test_modules' test_errors_nn_Embedding: the module's weight stays on the CPU (test_errors builds it
# without .to(device)) and the indices are float tensors on the device; CUDA has no kernel of its own for
# embedding (its CompositeExplicitAutograd kernel checks the indices' dtype first), a vendor's device
# kernel (Ascend's table lists embedding) checks devices first, as torch_npu's generated wrapper does.
MIXED_INPUT_CLASS = ("the test mixes devices by accident (a module left on the CPU, inputs on the device): the "
                     "device's own kernel (the vendor's) reports the mixing before the dtype check CUDA's "
                     "composite kernel reaches first")


# test_nn's test_transformerencoderlayer: the test guesses whether torch took TransformerEncoderLayer's fast
# path from `result.is_cuda or result.is_cpu`; torch's fast path also accepts the PrivateUse1 device
# (nn/modules/transformer.py: _supported_device_type names _privateuse1_backend_name), so on the npu (and
# on torch_npu) the fast path ran and gave its NaN rows for a fully masked input, where the test expects
# the slow path's finite rows.
FAST_PATH_CLASS = ("the test guesses torch's TransformerEncoderLayer fast path from is_cuda/is_cpu; torch takes "
                   "it on the PrivateUse1 device too, so the fast path's results meet the slow path's checks")


def fast_path_rule() -> Rule:
    return (FAST_PATH_CLASS, BY_DESIGN, r"^AssertionError: False is not true$",
            r"fast_path_device = result\.is_cuda or result\.is_cpu")


def mixed_input_rule() -> Rule:
    return (MIXED_INPUT_CLASS, BY_DESIGN,
            r'does not match "Expected all tensors to be on the same device, but got \w+ is on \w+:\d+, '
            r'different from other tensors on cpu', None)


def quantized_rule(target: str) -> Rule:
    """Quantized tensors on a device whose Quantized<target> key has no kernels (torch has quantized
    backends for the CPU and CUDA only; the CPU target has the CPU's)."""
    return ("quantized tensors: torch's quantized backends are QuantizedCPU and QuantizedCUDA; "
            f"Quantized{target} has no kernels", BY_DESIGN, rf"'Quantized{re.escape(target)}' backend", None)


def rules_for(target: str = "cpu", emulate: bool = False) -> list[Rule]:
    """The rules of a run: all of :data:`RULES` where "cuda" is the CPU (the CPU target); on a device
    distinct from the CPU (``emulate``) the one-device classes go and only the naming rule stays,
    and quantized tensors meet the device's empty quantized backend."""
    if not emulate:
        return RULES
    return [device_name_rule(target), device_compare_rule(target), quantized_rule(target), mixed_input_rule(),
            fast_path_rule(),
            *(r for r in RULES if r[0] not in ONE_DEVICE_ONLY)]


def classify(text: str, rules: list[Rule] = RULES) -> tuple[str, str]:
    """(class, kind) of a failure: the first rule whose message pattern matches the message
    (first non-empty line) and whose context pattern, if any, matches anywhere in the text."""
    message = next((ln for ln in text.splitlines() if ln.strip()), "")
    for name, kind, msg_pattern, ctx_pattern in rules:
        if re.search(msg_pattern, message) and (ctx_pattern is None or re.search(ctx_pattern, text)):
            return name, kind
    return OTHER


def parse_junit(path: Path) -> dict[str, dict[str, str]]:
    """``Class::test`` -> {"outcome": passed|failed|error|skipped, "text": message + traceback}."""
    out: dict[str, dict[str, str]] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        key = f"{cls}::{case.get('name')}"
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                text = f"{child.get('message', '')}\n{child.text or ''}"
                break
        out[key] = {"outcome": outcome, "text": text}
    return out


def run_pytest(test_dir: Path, file: str, adapted: bool, xml: Path, *, timeout: int, k: str | None,
               wall_limit: int, target: str = "cpu", emulate: bool = False) -> dict[str, Any]:
    """One fresh interpreter: pytest over ``file`` writing JUnit XML; returns rc and wall time."""
    env = dict(os.environ, PYTORCH_TEST_WITH_SLOW="0", PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    if adapted:  # adapter_plugin.py reads these
        env["CONFORMANCE_TARGET"] = target
        env["CONFORMANCE_EMULATE"] = "1" if emulate else "0"
    if emulate:  # the emulated device's own PrivateUse1 classes are not what is measured: the CUDA ones are
        env["PYTORCH_TESTING_DEVICE_EXCEPT_FOR"] = "privateuse1"
    paths = [str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [sys.executable, "-m", "pytest", file, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "-o", "junit_logging=no", f"--timeout={timeout}", "-W", "ignore::DeprecationWarning"]
    if adapted:
        cmd += ["-p", "adapter_plugin"]
    cmd += ["-p", "compat_plugin"]  # both runs: the newer test files on 2.13's test helpers (compat_plugin.py)
    if k:
        cmd += ["-k", k]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=test_dir, env=env, capture_output=True, text=True, timeout=wall_limit)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = -9, f"wall limit {wall_limit}s exceeded: {exc}"
    return {"rc": rc, "wall_s": round(time.perf_counter() - t0, 1), "tail": tail}


def _cuda_key(cpu_key: str) -> str:
    cls, name = cpu_key.split("::", 1)
    return f"{cls[:-3]}CUDA::{re.sub(r'_cpu(?=_|$)', '_cuda', name, count=1)}"


def compare(plain: dict[str, dict[str, str]], adapted: dict[str, dict[str, str]],
            rules: list[Rule] = RULES) -> dict[str, Any]:
    """Match CPU-plain tests to their CUDA-adapted twins; classify the ones that got worse."""
    cpu = {k: v for k, v in plain.items() if k.split("::")[0].endswith("CPU")}
    cpu_pass = [k for k, v in cpu.items() if v["outcome"] == "passed"]
    rows, changed, cuda_pass = [], [], 0
    for key in cpu_pass:
        twin = adapted.get(_cuda_key(key))
        if twin is None:
            continue  # no CUDA twin (onlyCPU, dtypesIfCUDA differences): not comparable
        if twin["outcome"] == "passed":
            cuda_pass += 1
        elif twin["outcome"] in ("failed", "error"):
            name, kind = classify(twin["text"], rules)
            first = next((ln for ln in twin["text"].splitlines() if ln.strip()), "")[:200]
            rows.append({"test": _cuda_key(key), "class": name, "kind": kind, "message": first})
    for key, v in cpu.items():
        a = adapted.get(key)
        if a is not None and a["outcome"] != v["outcome"]:
            why = classify(a["text"], rules) if a["outcome"] in ("failed", "error") else ("", "")
            changed.append({"test": key, "plain": v["outcome"], "adapted": a["outcome"], "class": why[0],
                            "kind": why[1], "message": a["text"].splitlines()[0][:200] if a["text"] else ""})
    comparable = sum(1 for k in cpu_pass if _cuda_key(k) in adapted)
    by_design = sum(1 for r in rows if r["kind"] == BY_DESIGN)
    defects = sum(1 for r in rows if r["kind"] == DEFECT)
    skipped = comparable - cuda_pass - len(rows)
    denom = comparable - by_design - skipped
    return {"tests": len(cpu), "cpu_pass": len(cpu_pass), "comparable": comparable, "cuda_pass": cuda_pass,
            "cuda_skipped": skipped, "by_design": by_design, "defects": defects,
            "percent": round(100.0 * cuda_pass / denom, 2) if denom > 0 else None,
            "failures": rows, "cpu_changed": changed}


def run_file(test_dir: Path, file: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"file": file}
    runs = {}
    for adapted in (False, True):
        xml = work / f"{file}.{'adapted' if adapted else 'plain'}.xml"
        if args.reuse_xml and xml.exists():  # recompute from the last run's XML (its wall times kept)
            info = {"wall_s": args.previous.get(file, {}).get(f"{'adapted' if adapted else 'plain'}_wall_s"), "tail": ""}
        else:
            xml.unlink(missing_ok=True)
            info = run_pytest(test_dir, file, adapted, xml, timeout=args.timeout, k=args.file_k.get(file, args.k),
                              wall_limit=args.wall_limit, target=args.target, emulate=args.emulate)
        res[f"{'adapted' if adapted else 'plain'}_wall_s"] = info["wall_s"]
        runs[adapted] = parse_junit(xml)
        broken = [v["text"] for k, v in runs[adapted].items() if k.startswith("::") and v["outcome"] == "error"]
        if broken:  # pytest's "collection failure": the file does not import against this torch
            e_lines = [ln for ln in broken[0].splitlines() if ln.startswith("E ")]
            res["error"] = f"import error ({'adapted' if adapted else 'plain'}): " + \
                (e_lines[-1][1:].strip() if e_lines else broken[0].splitlines()[0])
            return res
        if not runs[adapted]:
            res["error"] = ("import error" if "rror" in info["tail"] else "no results") + \
                f" ({'adapted' if adapted else 'plain'}): " + info["tail"][-600:]
            return res
    res.update(compare(runs[False], runs[True], rules_for(args.target, args.emulate)))
    return res


def meta() -> dict[str, Any]:
    import platform

    import torch

    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
            "python": platform.python_version(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def _changed(rows: list[dict[str, Any]]) -> str:
    """The CPU-changed cell: how many, and how many of them are defects (the rest by design: a CPU-class
    test that takes its CUDA branch under the adapter, e.g. test_modules' test_to)."""
    defects = sum(1 for r in rows if r.get("kind") != BY_DESIGN)
    return f"{len(rows)} ({defects} defects)" if rows else "0"


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| file | tests (CPU) | CPU pass | CUDA pass | CUDA skip | by design | defects | % | CPU changed | wall s (plain/adapted) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['file']} | {r['error'].splitlines()[0][:60]} | | | | | | | | |")
            continue
        pct = "-" if r["percent"] is None else f"{r['percent']:.1f}"
        lines.append(f"| {r['file']} | {r['tests']} | {r['cpu_pass']} | {r['cuda_pass']} | {r['cuda_skipped']} | "
                     f"{r['by_design']} | {r['defects']} | {pct} | {_changed(r['cpu_changed'])} | "
                     f"{r['plain_wall_s']}/{r['adapted_wall_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("test_dir", type=Path)
    ap.add_argument("--files", help="comma-separated file names (default: those of --set present)")
    ap.add_argument("--set", choices=sorted(FILE_SETS), default="default",
                    help="the known files to run when --files is not given: default (the seven operator files) "
                         "or wide (test_modules, test_optim, test_nn, test_torch)")
    ap.add_argument("-k", help="pytest -k expression (both runs)")
    ap.add_argument("--file-k", action="append", default=[], metavar="FILE=EXPR",
                    help="a -k expression for one file only (repeatable; it replaces -k for that file)")
    ap.add_argument("--target", default="cpu", help="the adapted run's target (default cpu)")
    ap.add_argument("--emulate", action="store_true",
                    help="run the adapted pass on the emulated device (--target npu): a device distinct from "
                         "the CPU, so the one-device by-design rules are not applied")
    ap.add_argument("--json", type=Path, default=None,
                    help="default benchmarks/results/conformance.json (conformance-emulated.json with --emulate)")
    ap.add_argument("--timeout", type=int, default=120, help="per-test timeout (pytest-timeout), seconds")
    ap.add_argument("--wall-limit", type=int, default=3600, help="per pytest run, seconds")
    ap.add_argument("--write-figures", action="store_true")
    ap.add_argument("--figures-name", default="conformance",
                    help="docs/figures/NAME.{json,md} for --write-figures (a second selection keeps the first's)")
    ap.add_argument("--reuse-xml", action="store_true",
                    help="classify the JUnit XML the last run left (no pytest run; after a rule change)")
    args = ap.parse_args(argv)
    args.file_k = dict(item.split("=", 1) for item in args.file_k)
    if args.json is None:
        args.json = REPO / "benchmarks" / "results" / ("conformance-emulated.json" if args.emulate else "conformance.json")
    args.previous = {}
    if args.reuse_xml and args.json.exists():
        args.previous = {r["file"]: r for r in json.loads(args.json.read_text()).get("results", [])}
    files = args.files.split(",") if args.files else [f for f in FILE_SETS[args.set] if (args.test_dir / f).exists()]
    args.json = args.json.resolve()  # pytest runs in TEST_DIR: the XML path must not be relative
    work = args.json.parent / f"{args.json.stem}_xml"  # conformance_xml for the default JSON
    work.mkdir(parents=True, exist_ok=True)
    m = meta()
    results = []
    for f in files:
        print(f"== {f}", flush=True)
        results.append(run_file(args.test_dir.resolve(), f, work, args))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    m["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    cmd = "python benchmarks/conformance/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.reuse_xml and args.json.exists():  # the figures are the earlier run's: its command and conditions
        prev = json.loads(args.json.read_text())
        cmd = prev.get("command", cmd).split("  # ")[0] + "  # classified again with --reuse-xml"
        m = prev.get("meta", m)
    m["target"], m["emulate"] = args.target, args.emulate
    doc = {"name": "conformance", "meta": m, "command": cmd, "results": results}
    print(table(results))
    for r in results:
        for row in r.get("failures", []):
            print(f"  [{row['kind']}] {row['class']}: {row['test']}  {row['message'][:100]}")
        for row in r.get("cpu_changed", []):
            print(f"  [CPU changed] {row['test']}: {row['plain']} -> {row['adapted']} [{row['kind']}] {row['class']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    if args.write_figures:
        fig = REPO / "docs" / "figures"
        (fig / f"{args.figures_name}.json").write_text(json.dumps(doc, indent=2) + "\n")
        (fig / f"{args.figures_name}.md").write_text(
            "# Conformance: PyTorch's device-generic tests under torch_adapter\n\n"
            f"Command: `{cmd}`\n\n{table(results)}\n\n"
            f"torch {m['torch']}, CPU capability {m['cpu_capability']}, {m['cpu_count']} CPUs, "
            f"{m['torch_threads']} torch threads, load average {m['load_average']} -> {m['load_average_end']}.\n"
            "% = CUDA pass / (CPU pass with a CUDA twin − by design − CUDA skipped). "
            "Classes: benchmarks/conformance/README.md.\n")
        print(f"wrote {fig / (args.figures_name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
