"""PyTorch's OpInfo database under the simulated mps target: results must match plain runs.

Each OpInfo sample runs twice — with the routing engine's kernels removed (plain torch)
and installed (every op MPS lacks really runs its decomposition or CPU fallback) — forward
and, where the OpInfo supports autograd, backward; in-place variants too. Outputs and
gradients are compared with ``torch.testing.assert_close`` at its dtype tolerances (the
ones OpInfo tests use). A sample whose plain run is not reproducible (random ops) is
left out of the figure.

Dtypes: float32, float64, bfloat16 and float16, each where the OpInfo supports it on the
CPU (an OpInfo with none of them runs in its first dtype); backward where the OpInfo
supports autograd in that dtype.

Fallbacks: on this CPU host the fallback's kernel is the plain run's kernel, so what a
fallback sample tests is the engine's copy path — every tensor cloned to "the CPU" and back,
mutated arguments written back, returned inputs given back as themselves. Each fallback
sample must show bytes copied (the path ran), and ``test_a_broken_copy_path_is_caught``
breaks the write-back on purpose and requires the sweep to report mismatches.

The fast subset runs in CI and must match 100 % (the figure docs/routing.md quotes);
``pytest -m full_sweep`` sweeps all of ``op_db`` and writes ``docs/figures/routing_opinfo_mps.json``
+ ``.md`` (committed; docs/routing.md quotes them) with every mismatch and its reason.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import torch_adapter
from torch_adapter.routing.log import RoutingLog

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
GOAL = 1.0  # every compared sample matches (docs/routing.md)
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# ops whose CPU fallback on mps writes into an argument (an in-place variant, an out= overload)
WRITING_FALLBACK_OPS = ("nn.functional.rrelu", "linalg.inv")

# Ops whose samples exercise composite or fallback routes on mps (found by the full sweep),
# cheap enough for CI: decompositions, declined decompositions, CPU fallbacks, in-place.
FAST_OPS = (
    "frexp", "narrow_copy", "logdet", "logit", "special.ndtri", "special.log_ndtr", "heaviside",
    "nn.functional.adaptive_avg_pool3d", "nn.functional.conv_transpose2d", "_upsample_bilinear2d_aa",
    "nn.functional.multilabel_margin_loss", "mode", "linalg.eigh", "nn.functional.adaptive_max_pool3d",
    "nn.functional.multi_margin_loss", "nn.functional.pdist", "nn.functional.ctc_loss",
    "nn.functional.channel_shuffle", "all", "any", "take", "nn.functional.scaled_dot_product_attention",
    "nn.functional.rrelu", "geqrf", "linalg.inv", "linalg.solve", "std", "var",
)


def _clone(obj: Any, grad: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        c = obj.detach().clone()
        return c.requires_grad_(obj.requires_grad) if grad and (c.is_floating_point() or c.is_complex()) else c
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o, grad) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v, grad) for k, v in obj.items()}
    return obj


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in _leaves(o)]
    if isinstance(obj, dict):
        return [x for o in obj.values() for x in _leaves(o)]
    return [obj]


def _run(fn: Any, sample: Any, grad: bool) -> tuple[list[Any], list[Any]]:
    inp, args, kwargs = _clone(sample.input, grad), _clone(sample.args, grad), _clone(sample.kwargs, grad)
    torch.manual_seed(0)
    out = fn(inp, *args, **kwargs)
    outs = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in _leaves(out)]
    grads: list[Any] = []
    if grad:
        wrt = [t for t in _leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
        diff = [o for o in _leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if wrt and diff:
            gen = torch.Generator().manual_seed(1)
            cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in diff]
            grads = list(torch.autograd.grad(diff, wrt, cots, allow_unused=True))
    # in-place variants: the mutated input is the result
    outs.append(inp.detach().clone() if isinstance(inp, torch.Tensor) else None)
    return outs, grads


# ops whose results are uninitialized memory: only shape and dtype are defined
UNDEFINED_VALUES = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def _same(a: list[Any], b: list[Any], values: bool = True) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} results vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if not values and isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if (x.shape, x.dtype) != (y.shape, y.dtype):
                return f"result {i}: {tuple(y.shape)} {y.dtype} != {tuple(x.shape)} {x.dtype}"
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            try:
                torch.testing.assert_close(y, x, equal_nan=True, check_stride=False)
            except AssertionError as exc:
                return f"result {i}: {str(exc).splitlines()[0]} {' '.join(str(exc).split())[:160]}"
        elif x != y and not (x != x and y != y):
            return f"result {i}: {y!r} != {x!r}"
    return None


def _attempt(fn: Any, sample: Any, grad: bool) -> tuple[Any, str | None]:
    try:
        return _run(fn, sample, grad), None
    except Exception as exc:  # noqa: BLE001 - any failure of the op is data for the report
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def sweep(ops: list[Any], engine: Any, *, max_samples: int | None = None,
          op_budget_s: float = 20.0) -> list[dict[str, Any]]:
    """Run ``ops`` plain and routed; one record per (op, variant, sample)."""
    records: list[dict[str, Any]] = []
    for info in ops:
        supported = info.supported_dtypes("cpu")
        dtypes = [d for d in DTYPES if d in supported] or sorted(supported, key=str)[:1]
        for dtype in dtypes:
            records += _sweep_one(info, dtype, engine, max_samples, op_budget_s)
    return records


def _fallback_bytes(log: RoutingLog) -> tuple[int, int]:
    """(fallback calls, bytes they copied) in ``log``."""
    calls = copied = 0
    for e in log.entries.values():
        if str(getattr(e.route, "value", e.route)) == "fallback":
            calls += e.calls
            copied += e.bytes_copied
    return calls, copied


def _sweep_one(info: Any, dtype: Any, engine: Any, max_samples: int | None, op_budget_s: float) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    t_op = time.perf_counter()
    grad = bool(info.supports_autograd and dtype.is_floating_point
                and dtype in info.supported_backward_dtypes("cpu"))
    engine.detach()
    try:
        samples = list(info.sample_inputs("cpu", dtype, requires_grad=grad))
    except Exception as exc:  # noqa: BLE001
        records.append({"op": info.name, "variant": "-", "sample": -1, "dtype": str(dtype),
                        "status": "no samples", "detail": repr(exc)[:200]})
        engine.refresh()
        return records
    samples = samples[:max_samples] if max_samples else samples
    variants = [("op", info.op, grad)]
    if info.inplace_variant is not None:
        variants.append(("inplace", info.inplace_variant, False))
    for vname, fn, g in variants:
        for i, sample in enumerate(samples):
            if time.perf_counter() - t_op > op_budget_s:
                records.append({"op": info.name, "variant": vname, "sample": i, "status": "over budget",
                                "detail": f"{len(samples) - i} samples not run (op budget {op_budget_s} s)"})
                break
            rec = {"op": info.name, "variant": vname, "sample": i, "dtype": str(dtype), "grad": g,
                   "input_bytes": sum(t.nbytes for t in _leaves((sample.input, sample.args, sample.kwargs))
                                      if isinstance(t, torch.Tensor))}
            engine.detach()
            plain, err = _attempt(fn, sample, g)
            if err is not None:
                records.append({**rec, "status": "plain error", "detail": err})
                continue
            engine.refresh()
            log = RoutingLog("mps", True)
            engine.add_log(log)
            try:
                routed, rerr = _attempt(fn, sample, g)
            finally:
                engine.remove_log(log)
            rec["routes"] = sorted({f"{r.op} ({r.route}, {r.via})" for r in log.entries.values()})
            rec["fallback_calls"], rec["fallback_bytes"] = _fallback_bytes(log)
            if rerr is not None:
                records.append({**rec, "status": "mismatch", "detail": f"routed run raised {rerr}"})
                continue
            values = info.name not in UNDEFINED_VALUES
            diff = _same(plain[0], routed[0], values)
            if diff is None:
                gdiff = _same(plain[1], routed[1], values)
                diff = f"gradient {gdiff}" if gdiff else None
            if diff:
                engine.detach()
                again, _ = _attempt(fn, sample, g)
                engine.refresh()
                if again is None or _same(plain[0], again[0]) or _same(plain[1], again[1]):
                    records.append({**rec, "status": "nondeterministic", "detail": diff})
                    continue
                records.append({**rec, "status": "mismatch", "detail": diff})
            else:
                records.append({**rec, "status": "match"})
    engine.refresh()
    return records


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(r["status"] for r in records)
    compared = counts["match"] + counts["mismatch"]
    routed = [r for r in records if r["status"] in ("match", "mismatch") and r.get("routes")]
    fallback = [r for r in routed if r.get("fallback_calls")]
    by_dtype = Counter(r["dtype"] for r in records if r["status"] in ("match", "mismatch"))
    return {"samples": len(records), "compared": compared, **counts,
            "match_rate": counts["match"] / compared if compared else 0.0,
            "routed_compared": len(routed),
            "routed_match_rate": (sum(r["status"] == "match" for r in routed) / len(routed)) if routed else 0.0,
            "fallback_compared": len(fallback),
            # a fallback on inputs that hold data must copy them (empty samples copy nothing)
            "fallback_without_copies": sum(1 for r in fallback if r["input_bytes"] and not r["fallback_bytes"]),
            "compared_by_dtype": dict(sorted(by_dtype.items()))}


def _op_db() -> list[Any]:
    # import before install(): op_db's module-level code touches torch.cuda.jiterator
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


@pytest.fixture
def op_db():
    return _op_db()


@pytest.fixture
def mps_engine(op_db):
    # the op routes' numerics in every dtype: what a real MPS refuses by dtype (float64) is
    # tests/test_dtype_preview.py's subject, so the dtype check is off here
    session = torch_adapter.install(target="mps", simulate=True, dtype_check="off")
    yield session.routing
    torch_adapter.uninstall()


def test_fast_opinfo_subset_matches_plain(op_db, mps_engine):
    ops = [o for o in op_db if o.name in FAST_OPS]
    assert len(ops) >= 20
    records = sweep(ops, mps_engine, max_samples=4, op_budget_s=6.0)
    fig = figures(records)
    bad = [r for r in records if r["status"] == "mismatch"]
    assert fig["routed_compared"] >= 40, fig
    assert set(fig["compared_by_dtype"]) >= {str(d) for d in DTYPES}, fig
    assert fig["fallback_compared"] >= 10 and fig["fallback_without_copies"] == 0, fig
    assert fig["match_rate"] >= GOAL, json.dumps(bad, indent=1)[:4000]


def test_a_broken_copy_path_is_caught(op_db, mps_engine, monkeypatch):
    """The sweep can fail: with the fallback's write-back broken, in-place fallbacks mismatch."""
    from torch_adapter.routing import engine as engine_mod

    monkeypatch.setattr(engine_mod, "_write_back", lambda orig, moved, nbytes: None)
    ops = [o for o in op_db if o.name in WRITING_FALLBACK_OPS]
    assert len(ops) == len(WRITING_FALLBACK_OPS)
    records = sweep(ops, mps_engine, max_samples=3, op_budget_s=6.0)
    caught = {r["op"] for r in records if r["status"] == "mismatch" and r.get("fallback_calls")}
    assert caught == set(WRITING_FALLBACK_OPS), json.dumps(records, indent=1)[:3000]


@pytest.mark.full_sweep
@pytest.mark.timeout(4 * 3600)  # ~30 min on one idle core
def test_full_opinfo_sweep(op_db, mps_engine):
    """``OPINFO_MAX_SAMPLES=N`` caps the samples per OpInfo, dtype and variant (a shorter sweep;
    the figures record the cap)."""
    import os

    cap = int(os.environ.get("OPINFO_MAX_SAMPLES", "0")) or None
    t0 = time.perf_counter()
    records = sweep(op_db, mps_engine, max_samples=cap, op_budget_s=300.0)
    fig = figures(records)
    fig["seconds"] = round(time.perf_counter() - t0, 1)
    fig["max_samples_per_op_dtype"] = cap
    fig["torch"] = torch.__version__
    from torch_adapter.core.safe_io import write_text

    write_text(FIGURES / "routing_opinfo_mps.json", json.dumps({"figures": fig, "records": records}, indent=1))
    lines = [f"# OpInfo sweep under simulated mps (torch {torch.__version__})", "",
             "```", json.dumps(fig, indent=1), "```", "", "## Mismatches", ""]
    for r in records:
        if r["status"] == "mismatch":
            lines.append(f"- `{r['op']}` {r['variant']} sample {r['sample']}: {r['detail']}  \n"
                         f"  routed: {', '.join(r.get('routes', [])) or '(no op routed)'}")
    write_text(FIGURES / "routing_opinfo_mps.md", "\n".join(lines) + "\n")
    assert fig["match_rate"] >= GOAL, fig
