"""The optimization layer on an unchanged CUDA-written training step: each level against eager.

The tiny-SD training step of ``workloads.py`` (``sd_unet``: ``.to("cuda")``, AdamW,
``torch.cuda.synchronize()``), not edited, timed interleaved under:

- ``plain``         torch untouched, on this machine's device (the baseline);
- ``redirect``      ``adapted("cpu")``, conservative: redirection only (install/uninstall
                    sit outside the timed region) — the redirect-only throughput kept;
- ``balanced``      ``optimization_level="balanced"``: fused AdamW, autocast in the target's
                    fast low precision *where it has one* (not on a CPU without bf16 units) —
                    measured on the step first and kept only if it wins (optimization/trial.py);
- ``aggressive``    balanced + torch.compile of the model that ran (first step compiles), also
                    on trial; goals: ≥ 1.0x everywhere, ≥ 1.3x where the CPU has bf16 units;
- ``balanced_untried``, ``aggressive_untried`` (``--configs``): the levels without the trial
                    (``TORCH_ADAPTER_TRIAL=0``): what the table alone would cost here;
- levers (``--configs``): ``bf16_autocast``, ``sdpa_math``, ``fused_adamw`` — plain torch with one part
                    pulled by hand.

The trial's decisions are printed per level and part (on vs off inside the level: the per-part
attribution on this CPU) and written to the JSON's ``meta.trial``; the warm-up covers the trials' steps.

Then, apart from the timing, the loss of the same seeded steps under each configuration:
its largest relative drift from plain, and the slowest of those steps (the one that compiles:
models are adopted at their first call and compiled at their second). Not run in CI
(minutes: the aggressive model compiles, ~100 s cold on an idle 2-core CPU).

    nice python benchmarks/bench_optimize.py --quick
    python benchmarks/bench_optimize.py --configs plain,balanced,aggressive
    python benchmarks/bench_optimize.py --top-ops        # where the plain step's time goes
    python benchmarks/bench_optimize.py --configs plain,bf16_autocast,sdpa_math --drift-steps 2 --json optimize_levers

``--top-ops`` profiles the plain step (torch.profiler, CPU activity) and prints each op's share
of the step's self time: what a level could speed up at all.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, workloads  # noqa: E402

__all__ = ["main", "loss_drift"]


def _configs() -> list[harness.Configuration]:
    return [harness.plain(), harness.adapted("cpu", name="redirect", goal=0.995),
            harness.adapted("cpu", name="balanced", goal=1.0, optimization_level="balanced"),
            harness.adapted("cpu", name="aggressive", goal=_aggressive_goal(), optimization_level="aggressive")]


def _aggressive_goal() -> float:
    """Issue 38: never below 1.0x; 1.3x where the CPU has bf16 matmul units (AMX or avx512_bf16)."""
    from torch_adapter.core.cpu_features import cpu_features

    return 1.3 if cpu_features().bf16_units else 1.0


def _untried() -> list[harness.Configuration]:
    """The levels with every part as their table says, none measured first (``TORCH_ADAPTER_TRIAL=0``):
    what each level would cost on this CPU without the trial (``--configs plain,balanced_untried,...``)."""
    import contextlib

    def level(name: str) -> harness.Configuration:
        inner = harness.adapted("cpu", name=f"{name}_untried", optimization_level=name)

        @contextlib.contextmanager
        def context():
            from torch_adapter.optimization.trial import ENV

            old = os.environ.get(ENV)
            os.environ[ENV] = "0"
            try:
                with inner.context():
                    yield
            finally:
                if old is None:
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = old

        return harness.Configuration(inner.name, context, inner.device, inner.description + ", TORCH_ADAPTER_TRIAL=0")

    return [level("balanced"), level("aggressive")]


def trial_decisions() -> dict[str, dict[str, object]]:
    """Per level: what its trial measured on the step (each part on vs off, the others as the level has
    them) and kept — the per-part attribution on this CPU (optimization/trial.py)."""
    from torch_adapter.optimization.trial import decisions

    out: dict[str, dict[str, object]] = {}
    for row in decisions():  # the latest decision per level and part (loss_drift's short runs decide none)
        out.setdefault(str(row["level"]), {})[str(row["part"])] = {k: v for k, v in row.items() if k != "level"}
    return out


def _levers() -> list[harness.Configuration]:
    """Plain torch with one lever pulled by hand, for reference (``--configs plain,bf16_autocast,sdpa_math``):
    what a level could gain from low precision or another attention kernel on this machine."""
    import contextlib

    import torch

    def bf16() -> contextlib.AbstractContextManager:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def math() -> contextlib.AbstractContextManager:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])

    @contextlib.contextmanager
    def fused():  # AdamW(..., fused=True) where the workload makes its optimizer
        original = torch.optim.AdamW.__init__

        def init(self, *args, **kwargs):
            kwargs.setdefault("fused", True)
            original(self, *args, **kwargs)

        torch.optim.AdamW.__init__ = init
        try:
            yield
        finally:
            torch.optim.AdamW.__init__ = original

    device = harness.plain().device
    return [harness.Configuration("bf16_autocast", bf16, device, 'torch.autocast("cpu", bfloat16) around the step'),
            harness.Configuration("sdpa_math", math, device, "sdpa_kernel([SDPBackend.MATH]) around the step"),
            harness.Configuration("fused_adamw", fused, device, "AdamW(fused=True) built by the workload")]


def loss_drift(configs: list[harness.Configuration], steps: int = 4) -> dict[str, dict[str, object]]:
    """Per configuration: the losses of ``steps`` seeded steps, first-step seconds, and the
    largest relative difference from the first configuration's losses."""
    import torch.nn.functional as F

    out: dict[str, dict[str, object]] = {}
    original = F.mse_loss
    for cfg in configs:
        losses: list[float] = []

        def recording(*args, **kwargs):
            loss = original(*args, **kwargs)
            losses.append(float(loss.detach()))
            return loss

        F.mse_loss = recording
        try:
            with cfg.context():
                step = workloads.sd_unet.build(cfg.device)
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
        finally:
            F.mse_loss = original
        # models are adopted at their first call and changed from the next: step 2 compiles
        out[cfg.name] = {"losses": losses, "step_s": [round(t, 2) for t in times], "first_step_s": round(max(times), 2)}
    base = out[configs[0].name]["losses"]
    for row in out.values():
        row["max_rel_drift"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(row["losses"], base))
    return out


def top_ops(steps: int = 3, rows: int = 8) -> list[tuple[str, float, float]]:
    """The plain step under torch.profiler: (op, share of all ops' self CPU time, ms per step)."""
    from torch.profiler import ProfilerActivity, profile

    step = workloads.sd_unet.build(harness.plain().device)
    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]
    return [(e.key, e.self_cpu_time_total / total, e.self_cpu_time_total / steps / 1e3) for e in top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_arguments(parser, workloads=["sd_unet"])
    parser.add_argument("--drift-steps", type=int, default=4, help="seeded steps compared for loss drift")
    parser.add_argument("--top-ops", action="store_true", help="profile the plain step: each op's share of it")
    args = parser.parse_args(argv)
    if args.top_ops:
        rows = top_ops(steps=args.steps)
        for name, share, ms in rows:
            print(f"{share * 100:6.1f} %  {ms:8.1f} ms/step  {name}")
        if args.json:
            harness.write_meta_json(f"{Path(args.json).stem}_top_ops", {"ops": [
                {"op": n, "share": sh, "ms_per_step": ms} for n, sh, ms in rows]}, harness.json_folder(args.json))
        return 0
    configs = harness.select(_configs() + _untried() + _levers(),
                             args.configs or ",".join(c.name for c in _configs()))
    drift = loss_drift(configs, args.drift_steps)  # also warms the compile cache before timing
    if any(c.name in ("balanced", "aggressive") for c in configs):  # the trials end before the timed rounds
        from torch_adapter.optimization.trial import ORDER

        trial_steps = 1 + 2 * (2 + len(ORDER)) + 1  # the adopting step, two parts, the deciding boundary
        args.warmup = max(args.warmup, trial_steps)
        quick_warmup = trial_steps
    else:
        quick_warmup = 1
    results = harness.run_from_args(args, [workloads.sd_unet], configs, default_name="optimize",
                                    quick={"repeats": 3, "steps": 2, "warmup": quick_warmup, "min_block": 0})
    decisions = trial_decisions()
    for result in results:
        result.meta.update(loss_drift=drift, trial=decisions)
        folder = harness.json_folder(args.json) if args.json else None
        harness.write_json(result, folder)
        base = result.configs[0]
        for cfg in result.configs:
            d = drift[cfg.name]
            print(f"{cfg.name:>11}: {cfg.median_s * 1e3:8.1f} ms/step, {base.median_s / cfg.median_s:.3f}x vs "
                  f"{base.name} (goal {cfg.goal}); slowest (compiling) step {d['first_step_s']:6.1f} s; loss drift "
                  f"{d['max_rel_drift']:.2e} over {len(d['losses'])} steps")
    for name, parts in decisions.items():  # the per-part attribution: each part on vs off inside its level
        for part, row in parts.items():
            print(f"{name:>11} trial: {part} {row['speedup']:.3f}x ({row['on_ms']:.1f} ms on, {row['off_ms']:.1f} ms "
                  f"off, {row['steps']} steps) -> {'kept' if row['kept'] else 'turned off'}; CPU kind {row['cpu_kind']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
