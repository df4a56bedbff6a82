"""What this CPU computes fast: its low-precision units and vector width, as data (detected once).

One :class:`CpuFeatures` object answers for the whole package: the AMP/low-precision policy
(:mod:`torch_adapter.routing.low_precision`), the optimization levels
(:mod:`torch_adapter.optimization.layer`), ``torch-adapter targets`` and ``describe()``.

Where the flags come from (first that answers):

1. ``TORCH_ADAPTER_CPU_FEATURES`` — a *kind* (``avx2``, ``avx512``, ``avx512_bf16``,
   ``avx512_fp16``, ``amx``, ``amx_fp16``, ``neon``) or flag names separated by commas/spaces
   (``avx2,f16c``): the policy then decides as on that CPU (tests force each kind this way on
   any machine; so can a user whose CPU is misreported). :func:`forced` does the same in-process;
2. ``/proc/cpuinfo`` ``flags`` (x86) or ``Features`` (aarch64) on Linux;
3. ``sysctl hw.optional`` on macOS (``FEAT_BF16``, ``FEAT_FP16``, ``AdvSIMD``);
4. none: no low-precision units assumed (the safe answer: float32 compute).

The decision tables (measured per kind; docs/redirect.md "Low precision"): what a float16
matmul/convolution should compute in on this CPU (:data:`FLOAT16_COMPUTE`), and what float16
attention should (:meth:`CpuFeatures.attention_compute`: the same, except that where that is
bfloat16 without AMX-BF16 tiles, float32).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import subprocess
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["CpuFeatures", "cpu_features", "forced", "is_forced", "ENV_VAR", "KINDS", "FLOAT16_COMPUTE",
           "ATTENTION_WITHOUT_AMX"]

ENV_VAR = "TORCH_ADAPTER_CPU_FEATURES"
_AVX2 = ("sse4_2", "avx", "avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")
# Kinds a test or a user can force by name: the flags such a CPU reports.
KINDS: dict[str, tuple[str, ...]] = {
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512_bf16": (*_AVX512, "avx512_bf16"),  # e.g. AMD EPYC Zen 4 (the CPU)
    "avx512_fp16": (*_AVX512, "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"),  # Sapphire Rapids
    "amx": (*_AVX512, "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"),
    "amx_fp16": (*_AVX512, "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16"),
    "neon": ("asimd",),
}
_BF16 = frozenset({"avx512_bf16", "amx_bf16", "bf16", "feat_bf16"})
_FP16 = frozenset({"avx512_fp16", "amx_fp16", "asimdhp", "fphp", "feat_fp16"})
_RELEVANT = frozenset({*_AVX512, "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
                       "asimd", "asimdhp", "fphp", "bf16", "sve", "feat_bf16", "feat_fp16", "advsimd"})

# (condition, float16 compute dtype, why) — the first row that holds decides.
# x86 rows measured (docs/redirect.md); the ARM rows follow the units and are not measured yet.
FLOAT16_COMPUTE: tuple[tuple[str, str, str], ...] = (
    ("amx_fp16", "float16", "this CPU has AMX-FP16 tiles: float16 runs natively"),
    ("x86_bf16", "bfloat16", "this CPU has bf16 units ({bf16}) and {fp16}: bfloat16 is its fastest low precision"),
    ("fp16", "float16", "this CPU has fp16 units ({fp16})"),
    ("bf16", "bfloat16", "this CPU has bf16 units ({bf16}) and no fp16 units"),
    ("", "float32", "this CPU has no fp16 or bf16 units: both are emulated there, float32 is faster"),
)
# Attention is not a product like the others: torch's CPU flash attention (the kernel behind
# scaled_dot_product_attention) runs bfloat16 blocks through AMX tiles where the CPU has them and
# otherwise converts them around float32 work. Measured on an avx512_bf16 EPYC without AMX (1 thread,
# benchmarks/bench_attention_dtype.py): the forward 2-25 % slower in bfloat16 than in float32 at all
# eight shapes (21.4 vs 23.1 ms at (2, 8, 1024, 1024, 8), 0.90 vs 1.00 ms at (2, 4, 256, 256, 32)),
# where its bfloat16 matmuls take 22-24 % of float32's time.
ATTENTION_WITHOUT_AMX = ("float32", "this CPU has bf16 units ({bf16}) but no AMX-BF16 tiles, where torch's CPU "
                                    "flash attention is slower in bfloat16 than in float32")
_HOLDS = {"amx_fp16": lambda f: "amx_fp16" in f.flags,
          "x86_bf16": lambda f: bool(f.flags & {"avx512_bf16", "amx_bf16"}),
          "fp16": lambda f: bool(f.fp16_units), "bf16": lambda f: bool(f.bf16_units), "": lambda f: True}


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's capabilities that the adapter's decisions read (JSON-able: :meth:`as_dict`)."""

    flags: frozenset[str]  # the relevant flags, lower case (x86 /proc/cpuinfo names)
    source: str  # where they came from: "/proc/cpuinfo", "sysctl", "TORCH_ADAPTER_CPU_FEATURES=...", "none"
    machine: str = field(default_factory=platform.machine)
    torch_capability: str = ""  # torch.backends.cpu.get_cpu_capability(): the ATen kernels' ISA

    @property
    def bf16_units(self) -> tuple[str, ...]:
        return tuple(sorted(self.flags & _BF16))

    @property
    def fp16_units(self) -> tuple[str, ...]:
        return tuple(sorted(self.flags & _FP16))

    @property
    def amx(self) -> tuple[str, ...]:
        return tuple(sorted(f for f in self.flags if f.startswith("amx_")))

    @property
    def vector_bits(self) -> int:
        if "avx512f" in self.flags:
            return 512
        if "avx2" in self.flags or "avx" in self.flags:
            return 256
        return 128 if self.flags & {"asimd", "advsimd", "sse4_2"} else 0

    @property
    def kind(self) -> str:
        """A short name: ``amx_fp16``, ``avx512_fp16``, ``avx512_bf16``, ``avx512``, ``avx2``, ``arm_bf16``, …"""
        f = self.flags
        for name in ("amx_fp16", "avx512_fp16", "avx512_bf16"):
            if name in f:
                return name
        if "amx_bf16" in f:
            return "amx_bf16"
        if "avx512f" in f:
            return "avx512"
        if "avx2" in f:
            return "avx2"
        if f & {"bf16", "feat_bf16"}:
            return "arm_bf16"
        if f & {"asimdhp", "fphp", "feat_fp16"}:
            return "arm_fp16"
        return "arm" if f & {"asimd", "advsimd"} else "generic"

    def float16_compute(self) -> tuple[str, str]:
        """(dtype name, why): what a float16 matmul/convolution/attention computes in fastest here."""
        fp16 = ", ".join(self.fp16_units) or "no fp16 units"
        bf16 = ", ".join(self.bf16_units)
        for cond, dtype, why in FLOAT16_COMPUTE:
            if _HOLDS[cond](self):
                return dtype, why.format(fp16=fp16, bf16=bf16)
        raise AssertionError("unreachable: the table ends with an unconditional row")  # pragma: no cover

    def attention_compute(self) -> tuple[str, str]:
        """(dtype name, why): what a float16 attention (CPU flash attention, forward) computes in
        fastest here: :meth:`float16_compute`'s answer, except float32 where that is bfloat16 without
        AMX-BF16 tiles (:data:`ATTENTION_WITHOUT_AMX`)."""
        name, why = self.float16_compute()
        if name == "bfloat16" and "amx_bf16" not in self.flags:
            dtype, text = ATTENTION_WITHOUT_AMX
            return dtype, text.format(bf16=", ".join(self.bf16_units))
        return name, why

    def fast_low_precision(self) -> str | None:
        """The dtype below float32 this CPU computes fast in (bfloat16 first), or None."""
        if self.bf16_units:
            return "bfloat16"
        return "float16" if self.fp16_units else None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "flags": sorted(self.flags), "source": self.source, "machine": self.machine,
                "vector_bits": self.vector_bits, "bf16_units": list(self.bf16_units),
                "fp16_units": list(self.fp16_units), "amx": list(self.amx),
                "torch_capability": self.torch_capability, "float16_compute": self.float16_compute()[0],
                "attention_compute": self.attention_compute()[0], "fast_low_precision": self.fast_low_precision()}


def _parse(spec: str) -> frozenset[str]:
    out: set[str] = set()
    for word in spec.replace(",", " ").lower().split():
        out.update(KINDS.get(word, (word,)))
    return frozenset(out)


def _from_proc() -> frozenset[str] | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].lower().split())
    except OSError:
        return None
    return None


def _from_sysctl() -> frozenset[str] | None:
    if platform.system() != "Darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    flags = set()
    for line in out.splitlines():  # "hw.optional.arm.FEAT_BF16: 1", "hw.optional.AdvSIMD: 1"
        name, _, value = line.partition(":")
        if value.strip() == "1":
            flags.add(name.rsplit(".", 1)[-1].lower())
    return frozenset(flags)


def _torch_capability() -> str:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # pragma: no cover - a torch without the query
        return ""


_OVERRIDE: list[str] = []  # forced() in this process (innermost last)


@functools.lru_cache(maxsize=None)
def _detect(spec: str | None) -> CpuFeatures:
    if spec:
        return CpuFeatures(_parse(spec), f"{ENV_VAR}={spec}",
                           torch_capability=_torch_capability())
    for source, read in (("/proc/cpuinfo", _from_proc), ("sysctl", _from_sysctl)):
        flags = read()
        if flags is not None:
            return CpuFeatures(flags & _RELEVANT, source, torch_capability=_torch_capability())
    return CpuFeatures(frozenset(), "none", torch_capability=_torch_capability())


def cpu_features() -> CpuFeatures:
    """This CPU's features (read once per process and spelling; :func:`forced` / the env var override)."""
    spec = _OVERRIDE[-1] if _OVERRIDE else os.environ.get(ENV_VAR, "").strip() or None
    return _detect(spec)


@contextlib.contextmanager
def forced(spec: str) -> Iterator[CpuFeatures]:
    """Decide as on another CPU inside the block: ``with forced("avx2"): install(...)`` (tests).
    A session reads the features when it installs: the block must be around ``install()``."""
    if not isinstance(spec, str) or not _parse(spec):
        from ..errors import UsageError, format_error

        raise UsageError(format_error("torch_adapter.core.cpu_features.forced(spec)",
                                      f"a kind among {sorted(KINDS)} or flag names", repr(spec),
                                      fix='e.g. forced("avx512_bf16")'))
    _OVERRIDE.append(spec)
    try:
        yield cpu_features()
    finally:
        _OVERRIDE.pop()


def is_forced() -> bool:
    """Inside a :func:`forced` block (a kind decided by its table alone: no speed check)."""
    return bool(_OVERRIDE)
