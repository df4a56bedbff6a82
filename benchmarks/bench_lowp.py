"""Low precision on the CPU: device-aware float16 programs, adapted, against plain CPU torch.

The programs (``benchmarks/lowp_programs.py``) choose float16 when ``torch.cuda.is_available()``
(the adapter's answer) and float32 otherwise (plain CPU torch): a small SD UNet forward with
``torch.autocast(device)`` (the issue's program), DreamBooth class-image generation
(``torch_dtype`` by device, a tiny StableDiffusionPipeline, 4 steps) and LoRA/ControlNet
validation (the same under ``torch.autocast(device)``), at 32 px (16x16 latents: overhead-bound) and
``NAME@64`` (32x32 latents, the attention's sequence 1024 as in SD's 512 px inner blocks), and
``NAME:wide`` with an SD-like UNet width (160/320 channels, head dims 40/80; the tiny UNet's head dims
of 8/16 make attention exp-bound and every op overhead-bound). Configurations:

- ``plain``    ``python PROGRAM`` (float32 path);
- ``adapted``  ``python -m torch_adapter run PROGRAM`` (float16 path, the defaults: ``dtype_policy="auto"`` —
  float32 tensors where float16 is computed in float32 —, ``float16_compute="auto"`` — float16 tensors
  with the heavy ops rewritten where the CPU has bf16 units);
- ``f16_tensors`` the same with ``--dtype-policy float16`` (float16 tensors on every kind, heavy ops rewritten);
- ``bf16_plain`` plain torch running the program's CPU path in bfloat16 (the best a bfloat16 rewrite can reach);
- ``fp16``     the same with ``--float16-compute float16`` (the off switch: float16 as the CPU computes it).

Every sample is a fresh interpreter; rounds are interleaved (A B C C B A ...); a sample's value
is the median of its timed calls after one warm-up call, wall and process CPU time (``cpu``: with one
thread, the figure other processes' load disturbs least). CPU kinds: ``native`` (this CPU) and
kinds emulated on it by capping the ISA torch's kernels may use (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``) with ``TORCH_ADAPTER_CPU_FEATURES`` telling
the adapter the same — ``avx512_bf16`` (no fp16 units, no AMX: the issue's EPYC) and ``avx2``;
an emulated kind is an approximation of that CPU, and says so in the JSON.
``--table`` measures the per-dtype speed table (fp32/bf16/fp16 matmul, convolution, attention)
under each kind. JSON goes to ``benchmarks/results/lowp.json``; ``--figures`` writes
``docs/figures/lowp.json`` instead (the figures the docs quote).

    python benchmarks/bench_lowp.py --quick
    python benchmarks/bench_lowp.py --kinds native,avx512_bf16,avx2 --rounds 5 --table --figures
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

PROGRAMS = ROOT / "benchmarks" / "lowp_programs.py"
# kind -> (environment that caps the ISA, flags the host must have for the emulation to mean anything)
KINDS = {
    "native": ({}, ()),
    "avx512_bf16": ({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                     "TORCH_ADAPTER_CPU_FEATURES": "avx512_bf16"}, ("avx512_bf16",)),
    "avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
              "TORCH_ADAPTER_CPU_FEATURES": "avx2"}, ("avx2",)),
}
CONFIGS = {"plain": [], "adapted": ["-m", "torch_adapter", "run"],
           "f16_tensors": ["-m", "torch_adapter", "run", "--dtype-policy", "float16"],
           "fp16": ["-m", "torch_adapter", "run", "--float16-compute", "float16"],
           "bf16_plain": []}
# configurations that differ by environment: bf16_plain is plain torch running the program's CPU path
# in bfloat16 (lowp_programs.py reads LOWP_PLAIN_DTYPE): what any bfloat16 rewrite could reach at best
CONFIG_ENV = {"bf16_plain": {"LOWP_PLAIN_DTYPE": "bfloat16"}}
_TABLE = r"""
import json, time, torch, torch.nn.functional as F
def t(f, n=15):
    f(); f(); ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return sorted(ts)[n // 2] * 1e3
out = {}
for dt in (torch.float32, torch.bfloat16, torch.float16):
    a = torch.randn(256, 256, dtype=dt); x = torch.randn(1, 64, 32, 32, dtype=dt); w = torch.randn(64, 64, 3, 3, dtype=dt)
    q = torch.randn(2, 8, 256, 64, dtype=dt)
    out[str(dt)[6:]] = {"mm_256": t(lambda: a @ a), "conv3x3_64ch_32px": t(lambda: F.conv2d(x, w, padding=1)),
                        "sdpa_2x8x256x64": t(lambda: F.scaled_dot_product_attention(q, q, q))}
print(json.dumps(out))
"""


def _env(kind: str, threads: int) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    env.pop("TORCH_ADAPTER_CPU_FEATURES", None)
    env.update(KINDS[kind][0])
    return env


def run_program(config: str, program: str, kind: str, args: argparse.Namespace, folder: str,
                extra: tuple[str, ...] = ()) -> dict:
    """One fresh interpreter running ``program`` (``NAME[:wide][@PIXELS]``) under ``config`` and the
    kind's environment, pinned to ``args.pin``: the JSON line lowp_programs.py prints."""
    name, _, size = program.partition("@")  # class_images@64: the pipeline at 64 px; validation:wide: SD-like UNet width
    name, _, variant = name.partition(":")
    cmd = [sys.executable, *CONFIGS[config], str(PROGRAMS), name, "--steps", str(args.steps), "--folder", folder,
           "--size", size or "32", *(["--wide"] if variant == "wide" else []), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**_env(kind, args.threads), **CONFIG_ENV.get(config, {})},
                          timeout=900,
                          preexec_fn=harness.pinned(args.pin))
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line)


def build_pipelines(programs: list[str], folder: str, threads: int) -> None:
    """The tiny pipelines the programs but ``unet`` load, saved once into ``folder``."""
    if {p.partition("@")[0].partition(":")[0] for p in programs} - {"unet"}:
        subprocess.run([sys.executable, str(PROGRAMS), "build", "--folder", folder], check=True,
                       capture_output=True, env=_env("native", threads))


def _sample(config: str, program: str, kind: str, args: argparse.Namespace, folder: str) -> tuple[float, float, float]:
    """(wall, process CPU) milliseconds and minor page faults per call, each the median of the sample's timed calls."""
    got = run_program(config, program, kind, args, folder)
    return statistics.median(got["ms"]), statistics.median(got["cpu_ms"]), statistics.median(got["minor_faults"])


def _ratios(samples: dict[str, list[float]]) -> dict:
    plain = samples["plain"]
    return {"median_ms": {n: statistics.median(v) for n, v in samples.items()},
            "vs_plain": {n: statistics.median(plain) / statistics.median(v) for n, v in samples.items()},
            "paired_vs_plain": {n: statistics.median(p / c for p, c in zip(plain, v)) for n, v in samples.items()}}


def measure(program: str, kind: str, args: argparse.Namespace, folder: str) -> dict:
    """Wall-time figures at the top level; the same from process CPU time under ``cpu`` (with one
    thread per sample, CPU time is the figure a shared machine's load disturbs least)."""
    names = args.configs.split(",")
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    faults: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            w, c, f = _sample(name, program, kind, args, folder)
            wall[name].append(w)
            cpu[name].append(c)
            faults[name].append(f)
        if not args.quiet:
            print(f"  {program}/{kind} round {r + 1}: " + ", ".join(
                f"{n} {wall[n][-1]:.0f} ms (cpu {cpu[n][-1]:.0f}, {faults[n][-1]:.0f} faults)" for n in names), flush=True)
    return {"ms": wall, **_ratios(wall), "cpu": {"ms": cpu, **_ratios(cpu)}, "minor_faults_per_call": faults}


def speed_table(kind: str, threads: int, pin: int = -1) -> dict:
    done = subprocess.run([sys.executable, "-c", _TABLE], capture_output=True, text=True, env=_env(kind, threads),
                          timeout=600, check=True, preexec_fn=harness.pinned(pin))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", default="unet,class_images,class_images@64,validation@64,class_images:wide@64,"
                                         "validation:wide@64",
                   help="NAME[:wide][@PIXELS]: the pipelines at PIXELS (default 32), :wide with the SD-like UNet width")
    p.add_argument("--kinds", default="native,avx512_bf16,avx2")
    p.add_argument("--configs", default="plain,adapted,fp16",
                   help="plain first; fp16 (the off switch) is emulated float16: minutes per sample on a kind without fp16 units")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed calls per sample (after one warm-up call)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every sample (default 1: a shared machine)")
    p.add_argument("--table", action="store_true", help="also measure the per-dtype speed table per kind")
    p.add_argument("--pin", type=int, default=harness.default_pin(),
                   help="run every sample on this CPU (default: the last one; -1: not pinned). On a VM one core "
                        "can run 1.5x slower than the other for minutes: pinned, a sample's neighbours in time "
                        "ran where it did")
    p.add_argument("--quick", action="store_true", help="2 rounds, the native kind and the unet program only")
    p.add_argument("--figures", action="store_true", help="write docs/figures/lowp.json (else benchmarks/results/)")
    p.add_argument("--name", default="lowp")
    p.add_argument("--merge", action="store_true", help="add these kinds to an existing NAME.json")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.kinds, args.programs = 2, "native", "unet"
    from torch_adapter.core.cpu_features import cpu_features

    host = cpu_features()
    kinds = [k for k in args.kinds.split(",") if all(f in host.flags for f in KINDS[k][1])]
    result = {"name": args.name, "conditions_start": harness.conditions(args.threads), "kinds": {}, "tables": {},
              "pinned_cpu": args.pin if args.pin >= 0 else None, "rounds": args.rounds, "steps": args.steps}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as folder:
        build_pipelines(args.programs.split(","), folder, args.threads)
        for kind in kinds:
            env = KINDS[kind][0]
            entry = result["kinds"][kind] = {"emulated_by": env or None, "programs": {}}
            if args.table:
                result["tables"][kind] = speed_table(kind, args.threads, args.pin)
                print(f"{kind} per-dtype ms: {json.dumps(result['tables'][kind])}")
            for program in args.programs.split(","):
                entry["programs"][program] = m = measure(program, kind, args, folder)
                print(f"{program:16s} {kind:12s} " + "  ".join(
                    f"{n} {m['median_ms'][n]:7.0f} ms ({m['vs_plain'][n]:.2f}x, paired {m['paired_vs_plain'][n]:.2f}x,"
                    f" cpu {m['cpu']['paired_vs_plain'][n]:.2f}x)" for n in m["median_ms"]), flush=True)
    result["conditions_end"] = harness.conditions(args.threads, own=args.threads)  # one sample runs at a time
    result["loaded"] = result["conditions_start"]["loaded"] or result["conditions_end"]["loaded"]
    result["seconds"] = round(time.time() - t0, 1)
    out_dir = harness.FIGURES_DIR if args.figures else harness.RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.name}.json"
    if args.merge and path.exists():
        old = json.loads(path.read_text())
        old["kinds"].update(result["kinds"])
        old["tables"].update(result["tables"])
        old.setdefault("runs", []).append({k: result[k] for k in ("conditions_start", "conditions_end", "loaded",
                                                                  "seconds")})
        old["loaded"] = old["loaded"] or result["loaded"]
        result = old
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}{' (LOADED: load from other work above 0.5 per core)' if result['loaded'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
