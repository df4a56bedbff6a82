"""Per-cell observation in a live Jupyter kernel: what does `%load_ext torch_adapter` cost?

Issue 5's goal: observing every cell keeps >= 97 % of the throughput of the same kernel
with observation off, on the tiny SD1.5 UNet training step. Measured two ways, in one
real ipykernel (jupyter_client), both interleaved:

1. through the magic: ``%%adapter_compare --configs redirect,adapted`` (the cell body run
   under redirect-only and under redirect + routing observation, A B A B ...);
2. per cell, as a user sees it: cells running one training step each, alternating
   ``%adapter observe off`` / ``on``, timed from the client (execute request to reply),
   so the per-cell start/stop of the observer and the publishing of the bundle count.

    python benchmarks/bench_jupyter.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.97


def _execute(kc, code: str, timeout: float = 600) -> tuple[dict, list[dict], float]:
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append(msg["content"])
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    wall = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {code!r}: {outputs}")
    return reply, outputs, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--cells", type=int, default=4, help="timed cells per mode per round")
    parser.add_argument("--steps", type=int, default=3, help="training steps per timed run of the magic")
    parser.add_argument("--quick", action="store_true", help="a short run (fewer rounds)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "jupyter_sd_unet.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.cells, args.steps = 3, 3, 2

    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                 "from benchmarks.workloads import get\n"
                 "step = get('sd_unet').build('cuda')\n")
        _execute(kc, "%load_ext torch_adapter")
        _execute(kc, setup)
        for _ in range(3):
            _execute(kc, "step()")  # warm-up (observed)
        # 1. through the magic
        body = "\n".join(["step()"] * args.steps)
        _execute(kc, f"%%adapter_compare --configs redirect,adapted -n {args.repeats * 2} --warmup 1\n{body}")
        _, out, _ = _execute(kc, "import json\nprint(json.dumps({k: {kk: v[kk] for kk in ('runs_s', 'median_s', 'kept', 'error')}"
                                 " for k, v in _adapter_compare.items()}))")
        magic = json.loads("".join(o.get("text", "") for o in out if "text" in o).strip().splitlines()[-1])
        # 2. per cell, observe off/on alternating
        walls: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.repeats):
            for mode in ("off", "on"):
                _execute(kc, f"%adapter observe {mode}")
                _execute(kc, "step()")  # settle
                for _ in range(args.cells):
                    walls[mode].append(_execute(kc, "step()")[2])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    off, on = statistics.median(walls["off"]), statistics.median(walls["on"])
    result = {
        "name": "jupyter_sd_unet", "goal": GOAL,
        "magic": {"redirect_median_s": magic["redirect"]["median_s"], "adapted_median_s": magic["adapted"]["median_s"],
                  "kept": magic["adapted"]["kept"], "runs": magic},
        "per_cell": {"observe_off_median_s": off, "observe_on_median_s": on, "kept": off / on,
                     "walls_s": walls},
    }
    print(f"through %%adapter_compare: adapted keeps {magic['adapted']['kept']:.2%} of redirect-only "
          f"({magic['redirect']['median_s'] * 1e3:.1f} ms vs {magic['adapted']['median_s'] * 1e3:.1f} ms per run)")
    print(f"per cell (client wall): observed keeps {off / on:.2%} ({off * 1e3:.1f} ms off vs {on * 1e3:.1f} ms on); "
          f"goal {GOAL:.0%}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
