"""Is bfloat16 faster than float32 on this CPU? One measurement per machine, kept on disk.

Flags say which units a CPU has, not how fast torch's kernels use them. Measured on this project's
Xeon: with oneDNN capped at ``AVX512_CORE_BF16`` (as on a VM that hides AMX) a bfloat16 256² matmul
takes 0.41 ms against 0.32 ms in float32 and a 3×3 convolution 0.98 against 0.62 ms, where an EPYC
with the same avx512_bf16 flag runs bfloat16 3.8× faster than float32. So where the flags choose
bfloat16 for float16 work (:mod:`torch_adapter.routing.low_precision`, ``float16_compute="auto"``),
this check times a matmul and a convolution in both dtypes once, and bfloat16 is used only if it is
faster (:data:`MARGIN`). ~20 ms, once, on one thread (:data:`MEASURED_THREADS` says why): the
answer is stored in the start-up cache (:mod:`.disk_cache`) under everything it depends on —
torch's version and build, the CPU's flags and the variables that cap torch's kernels
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, …) — and read back by later processes (launcher
ranks, notebook kernels).

The same check times float16 attention's kernel (torch's CPU flash attention) in both dtypes: its
verdict, apart from the products', decides what attention computes in (:func:`attention_compute`),
either way — on an avx512_bf16 EPYC bfloat16 products run 4× faster than float32 while bfloat16
attention runs 2-25 % slower (no AMX tiles; benchmarks/bench_attention_dtype.py); where AMX packs
it, the flags' answer is bfloat16.

``TORCH_ADAPTER_SPEED_CHECK=off``: no measurement, the flags decide alone (also what
:func:`~.cpu_features.forced` blocks get: a forced kind is decided by its table, as tests need).
"""

from __future__ import annotations

import math
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Speed", "bfloat16_speed", "decide", "float16_compute", "attention_compute", "ENV", "MARGIN", "ATTENTION"]

ENV = "TORCH_ADAPTER_SPEED_CHECK"
# bfloat16 counts as faster when its products take under this share of float32's time (geometric
# mean over the matmul and the convolution): a CPU where they are about even keeps float32, whose
# numerics are closer to float16's.
MARGIN = 0.9
# Variables that change which kernels torch runs, hence the answer.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
              "MKL_CBWR", "ONEDNN_DEFAULT_FPMATH_MODE")
_OFF = ("0", "off", "false", "no")
ATTENTION = "sdpa_4h_256x32"  # the attention product's name; the others are the products (matmul, convolution)
# The check times on one thread, whatever the program's count (core/threads.py: on more it would start
# OpenMP's thread team in the program's process, and a process forked after that hangs); bfloat16
# against float32 is a property of a core's units, which the ratio compares.
MEASURED_THREADS = 1
_LOCK = threading.Lock()
_KNOWN: dict[str, Speed] = {}  # key text -> answer, per process


@dataclass(frozen=True)
class Speed:
    """The measured answer: per-product best times (ms) in each dtype, and the verdict."""

    float32_ms: dict[str, float]
    bfloat16_ms: dict[str, float]
    ratio: float  # geometric mean of bfloat16 / float32 over the products (attention apart)
    faster: bool  # ratio < MARGIN
    threads: int
    source: str  # "measured" (this process) or "cache"
    attention_ratio: float | None = None  # bfloat16 / float32 of the attention kernel (None: not timed)
    attention_faster: bool | None = None  # attention_ratio < MARGIN
    # product -> torch's error, for a product whose bfloat16 kernel raised here (its time is inf: never
    # faster). torch 2.13's CPU flash attention in bfloat16 raises "pack_vnni2 is only supported when
    # avx512 is supported" on an AMX CPU with ATEN_CPU_CAPABILITY=avx2: the program's own bfloat16
    # attention would raise the same, so float16 attention stays float32 there.
    errors: dict[str, str] = field(default_factory=dict)

    def text(self, which: str = "products") -> str:
        """``'a 512² mm 0.41 vs 0.32 ms, a 3×3 conv 0.98 vs 0.62 ms (bfloat16 vs float32, 1 thread)'``;
        ``which="attention"``: the attention kernel's times alone."""
        names = {"mm_512": "a 512² mm", "conv3x3_64ch_32px": "a 3×3 conv",
                 ATTENTION: "attention (4 heads, 256 tokens, 32 wide)"}
        keys = [k for k in self.float32_ms if (k == ATTENTION) == (which == "attention")]
        parts = [f"{names.get(k, k)} in bfloat16 raised ({self.errors[k]})" if k in self.errors else
                 f"{names.get(k, k)} {self.bfloat16_ms[k]:.2f} vs {self.float32_ms[k]:.2f} ms" for k in keys]
        return ", ".join(parts) + f" (bfloat16 vs float32, {self.threads} thread{'s' if self.threads != 1 else ''})"


def _ratio(float32_ms: dict[str, float], bfloat16_ms: dict[str, float], keys: list[str]) -> float | None:
    ratios = [bfloat16_ms[k] / float32_ms[k] for k in keys
              if 0 < float32_ms[k] < math.inf and (bfloat16_ms.get(k) or 0) > 0]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None


def decide(float32_ms: dict[str, float], bfloat16_ms: dict[str, float], threads: int, source: str,
           errors: dict[str, str] | None = None) -> Speed:
    """The verdicts from per-product best times (pure; :func:`bfloat16_speed` measures them): the
    products' (geometric mean) and, where it was timed, the attention kernel's. A product in ``errors``
    raised in bfloat16: its bfloat16 time is infinite (never faster)."""
    errors = dict(errors or {})
    bfloat16_ms = {k: (math.inf if k in errors else v) for k, v in bfloat16_ms.items()}
    ratio = _ratio(float32_ms, bfloat16_ms, [k for k in float32_ms if k != ATTENTION])
    ratio = 1.0 if ratio is None else ratio
    attention = _ratio(float32_ms, bfloat16_ms, [ATTENTION]) if ATTENTION in float32_ms else None
    return Speed(dict(float32_ms), dict(bfloat16_ms), round(ratio, 4), ratio < MARGIN, threads, source,
                 None if attention is None else round(attention, 4), None if attention is None else attention < MARGIN,
                 errors)


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in _OFF


def _key() -> dict[str, Any]:
    import torch

    from .cpu_features import _detect

    real = _detect(None)  # this machine's flags, whatever an override says
    return {"check": 3, "torch": str(torch.__version__), "git": str(getattr(torch.version, "git_version", "")),
            "machine": platform.machine(), "flags": sorted(real.flags), "threads": MEASURED_THREADS,
            "env": {k: os.environ.get(k, "") for k in KERNEL_ENV}}


def _measure(reps: int = 5) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """Best-of-``reps`` ms of each product in float32 and bfloat16, interleaved (a local generator:
    the program's random stream is untouched; no autograd, no autocast), on one thread
    (:data:`MEASURED_THREADS`; the program's thread count is put back after)."""
    from .threads import one_thread

    with one_thread():
        return _timed(reps)


def _timed(reps: int) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    inputs = {torch.float32: (torch.randn(512, 512, generator=g), torch.randn(1, 64, 32, 32, generator=g),
                              torch.randn(64, 64, 3, 3, generator=g), torch.randn(3, 1, 4, 256, 32, generator=g))}
    inputs[torch.bfloat16] = tuple(t.bfloat16() for t in inputs[torch.float32])
    products = {"mm_512": lambda a, x, w, q: a @ a, "conv3x3_64ch_32px": lambda a, x, w, q: F.conv2d(x, w, padding=1),
                ATTENTION: lambda a, x, w, q: F.scaled_dot_product_attention(q[0], q[1], q[2])}
    best: dict[torch.dtype, dict[str, float]] = {d: {k: math.inf for k in products} for d in inputs}
    errors: dict[str, str] = {}  # a product whose bfloat16 kernel raised: not timed again, never faster
    with torch.inference_mode(), torch.autocast("cpu", enabled=False):
        for _ in range(reps + 1):  # the first round warms the kernels up (oneDNN's primitive cache)
            for dtype, args in inputs.items():
                for name, product in products.items():
                    if dtype is torch.bfloat16 and name in errors:
                        continue
                    t0 = time.perf_counter()
                    try:
                        product(*args)
                    except RuntimeError as exc:
                        if dtype is not torch.bfloat16:
                            raise
                        errors[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                        continue
                    best[dtype][name] = min(best[dtype][name], (time.perf_counter() - t0) * 1e3)
    return ({k: round(v, 4) for k, v in best[torch.float32].items()},
            {k: (None if k in errors else round(v, 4)) for k, v in best[torch.bfloat16].items()}, errors)


def bfloat16_speed() -> Speed | None:
    """This machine's answer (measured once, then from the cache); None when the check is off."""
    if not enabled():
        return None
    import json

    from . import disk_cache

    key = _key()
    text = json.dumps(key, sort_keys=True)
    with _LOCK:
        known = _KNOWN.get(text)
        if known is not None:
            return known
        data = disk_cache.load("speed", key)
        speed = None
        if isinstance(data, dict):
            try:
                speed = decide(data["float32_ms"], data["bfloat16_ms"], int(data["threads"]), "cache",
                               data.get("bfloat16_errors") or {})
                if speed.attention_ratio is None:
                    raise KeyError(ATTENTION)
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                speed = None  # an entry of another shape: measured again, rewritten
        if speed is None:
            fp32, bf16, errors = _measure()
            speed = decide(fp32, bf16, key["threads"], "measured", errors)
            disk_cache.store("speed", key, {"float32_ms": fp32, "bfloat16_ms": bf16, "bfloat16_errors": errors,
                                            "threads": key["threads"]}, plain=True)
        _KNOWN[text] = speed
        return speed


def float16_compute() -> tuple[str, str]:
    """(dtype name, why) for ``float16_compute="auto"``: the flags' choice (:mod:`.cpu_features`),
    and where it is bfloat16, this check's verdict (float32 when bfloat16 is not faster here).
    Callers inside the routing layer run it under ``routing.internal.internal()`` (its ops are ours)."""
    from .cpu_features import cpu_features, is_forced

    name, why = cpu_features().float16_compute()
    if name != "bfloat16" or is_forced():
        return name, why
    speed = bfloat16_speed()
    if speed is None:
        return name, why
    if not speed.faster:
        return "float32", (f"{why}, but its bfloat16 kernels measured no faster than float32 here "
                           f"({speed.text()}; one-off check, {ENV}=off skips it)")
    return name, f"{why}; measured: bfloat16 products take {speed.ratio:.0%} of float32's time"


def attention_compute() -> tuple[str, str]:
    """(dtype name, why) of float16 attention (torch's CPU flash attention) under ``float16_compute="auto"``.
    Where :func:`float16_compute` chose float32 or float16, the same; where it chose bfloat16, this
    check's attention verdict (either way), else the flags' answer (:meth:`.CpuFeatures.attention_compute`:
    float32 without AMX-BF16 tiles). Run as :func:`float16_compute` is (under ``internal()``)."""
    from .cpu_features import cpu_features, is_forced

    main, why = float16_compute()
    if main != "bfloat16":
        return main, why
    features = cpu_features()
    name, flags_why = features.attention_compute()
    speed = None if is_forced() else bfloat16_speed()
    if speed is None or speed.attention_faster is None:
        return name, flags_why
    units = ", ".join(features.bf16_units)
    if speed.attention_faster:
        return "bfloat16", (f"this CPU has bf16 units ({units}); measured: bfloat16 attention takes "
                            f"{speed.attention_ratio:.0%} of float32's time ({speed.text('attention')})")
    if ATTENTION in speed.errors:
        return "float32", (f"this CPU has bf16 units ({units}), but torch's bfloat16 attention kernel raised here "
                           f"({speed.errors[ATTENTION]}; one-off check, {ENV}=off skips it)")
    return "float32", (f"this CPU has bf16 units ({units}), but its bfloat16 attention kernel measured no faster "
                       f"than float32 here ({speed.text('attention')}; one-off check, {ENV}=off skips it)")
