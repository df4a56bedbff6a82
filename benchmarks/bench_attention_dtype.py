"""Which dtype torch's CPU flash attention runs fastest in on this CPU: float32 against bfloat16.

The data behind float16 attention's compute dtype (routing/low_precision.py ``ATTENTION_OPS``,
core/cpu_features.py ``ATTENTION_WITHOUT_AMX``, the speed check's attention verdict in
core/cpu_speed.py): the forward and backward of ``aten::_scaled_dot_product_flash_attention_for_cpu``
at the shapes diffusers' and transformers' models give it, and, for comparison, a matmul of the same
CPU in both dtypes. Per shape the two dtypes alternate, best of ``--repeats`` timings each, so a slow
moment of the machine hits both alike; the ratio is bfloat16's time over float32's (below 1: bfloat16
faster). Records the CPU's flags, the thread count and the load with the figures.

    python benchmarks/bench_attention_dtype.py                # 1 thread; benchmarks/results/
    python benchmarks/bench_attention_dtype.py --figures      # docs/figures/attention_dtype.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402

__all__ = ["SHAPES", "measure", "main"]

# (batch, heads, query tokens, key tokens, head dim): a tiny SD UNet's self-attention at 32² latents
# (head dim 8), cross-attention to 8 or 77 text tokens, SD-like widths, a GPT-2-like block.
SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
    (2, 8, 1024, 1024, 8), (2, 8, 1024, 8, 8), (2, 4, 256, 256, 32), (2, 8, 1024, 1024, 40),
    (2, 8, 4096, 77, 40), (2, 8, 256, 256, 64), (1, 12, 64, 64, 64), (1, 8, 1024, 1024, 64))
MATMULS: tuple[tuple[int, int, int], ...] = ((2048, 320, 320), (512, 128, 512))


def _best(fn: Callable[[], Any], repeats: int, min_s: float = 0.05) -> float:
    """Best seconds per call over ``repeats`` timings of enough calls to last ``min_s``."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, int(min_s / one))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def measure(repeats: int = 5, shapes: tuple = SHAPES, backward: bool = True) -> dict[str, Any]:
    """Per shape: forward (and backward) ms in float32 and bfloat16, alternated, and the ratio."""
    import torch

    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    g = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for b, h, lq, lk, d in shapes:
            base = [torch.randn(b, h, n, d, generator=g) for n in (lq, lk, lk)]
            row: dict[str, Any] = {"shape": [b, h, lq, lk, d]}
            per: dict[str, dict[str, list[float]]] = {"forward": {}, "backward": {}}
            calls: dict[str, dict[str, Callable[[], Any]]] = {"forward": {}, "backward": {}}
            for dtype in (torch.float32, torch.bfloat16):
                q, k, v = (t.to(dtype) for t in base)
                name = str(dtype)[6:]
                calls["forward"][name] = lambda q=q, k=k, v=v: fwd(q, k, v)
                if backward:
                    out, lse = fwd(q, k, v)
                    grad = torch.randn(out.shape, generator=g).to(dtype)
                    calls["backward"][name] = (lambda grad=grad, q=q, k=k, v=v, out=out, lse=lse:
                                               bwd(grad, q, k, v, out, lse, 0.0, False))
            for _ in range(3):  # the dtypes alternate: a slow moment hits both
                for part, fns in calls.items():
                    for name, fn in fns.items():
                        per[part].setdefault(name, []).append(_best(fn, max(1, repeats // 3 + 1)))
            for part in ("forward", "backward"):
                if not per[part]:
                    continue
                f32, bf16 = min(per[part]["float32"]) * 1e3, min(per[part]["bfloat16"]) * 1e3
                row[part] = {"float32_ms": round(f32, 4), "bfloat16_ms": round(bf16, 4), "ratio": round(bf16 / f32, 3)}
            rows.append(row)
        products = []
        for m, k, n in MATMULS:
            a, w = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
            times = {}
            for dtype in (torch.float32, torch.bfloat16):
                aa, ww = a.to(dtype), w.to(dtype)
                times[str(dtype)[6:]] = _best(lambda aa=aa, ww=ww: aa @ ww, repeats) * 1e3
            products.append({"mm": [m, k, n], "float32_ms": round(times["float32"], 4),
                             "bfloat16_ms": round(times["bfloat16"], 4),
                             "ratio": round(times["bfloat16"] / times["float32"], 3)})
    ratios = [r["forward"]["ratio"] for r in rows]
    return {"attention": rows, "matmul": products,
            "forward_ratio_range": [min(ratios), max(ratios)], "forward_ratio_median": statistics.median(ratios)}


def _print(data: dict[str, Any], threads: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CPU flash attention, float32 vs bfloat16 ({threads} thread(s))")
    for col in ("shape (b, h, q, k, d)", "fwd fp32 ms", "fwd bf16 ms", "bf16/fp32", "bwd fp32 ms", "bwd bf16 ms",
                "bf16/fp32"):
        table.add_column(col, justify="right")
    for row in data["attention"]:
        f, b = row["forward"], row.get("backward")
        cells = [f"{f['float32_ms']:.3f}", f"{f['bfloat16_ms']:.3f}", f"{f['ratio']:.2f}"]
        cells += [f"{b['float32_ms']:.3f}", f"{b['bfloat16_ms']:.3f}", f"{b['ratio']:.2f}"] if b else ["", "", ""]
        table.add_row(str(tuple(row["shape"])), *cells)
    console = Console()
    console.print(table)
    for p in data["matmul"]:
        console.print(f"mm {tuple(p['mm'])}: float32 {p['float32_ms']:.3f} ms, bfloat16 {p['bfloat16_ms']:.3f} ms "
                      f"(bf16/fp32 {p['ratio']:.2f})")
    cond = harness.conditions(threads)
    console.print(f"cpu kind {cond['cpu'].get('kind')} (flags {', '.join(cond['cpu'].get('flags', []))}); "
                  f"load {cond['loadavg']}{' LOADED' if cond['loaded'] else ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per dtype and shape (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="two shapes, forward only (a smoke run)")
    parser.add_argument("--figures", action="store_true", help="write docs/figures/attention_dtype.json")
    args = parser.parse_args(argv)
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        data = measure(args.repeats, SHAPES[:2] if args.quick else SHAPES, backward=not args.quick)
        _print(data, args.threads)
        out = harness.FIGURES_DIR if args.figures else None
        harness.write_meta_json("attention_dtype", {"threads": args.threads, **data}, out)  # (while set: its meta)
    finally:
        torch.set_num_threads(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
