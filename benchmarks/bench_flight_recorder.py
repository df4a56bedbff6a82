"""What torch's flight recorder costs a collective: the hang help's price (launch/hang.py).

A reporting rank runs with ``TORCH_FR_BUFFER_SIZE=64`` (the adapter sets it when the user has not), so
every collective is written into torch's ring buffer. The recorder's size is read once per process,
so the two sides cannot alternate inside one process: each round starts one pair of gloo ranks with the
recorder on and one with it off (order mirrored every other round), and rank 0 times ``--calls``
``all_reduce`` calls of a ``--numel`` float32 tensor after a warm-up. Reported: the median per-call time
of each side over the rounds, their ratio (off / on: throughput kept with the recorder), and the
paired ratios' spread, with the machine's conditions (CPU flags, load).

    python benchmarks/bench_flight_recorder.py                 # 5 rounds, 2000 calls of 1024 floats
    python benchmarks/bench_flight_recorder.py --json flight_recorder   # the committed figure
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402

RANK = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist

    rank, port, calls, numel = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.ones(numel)
    for _ in range(200):
        dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    seconds = time.perf_counter() - t0
    if rank == 0:
        print(seconds / calls)
    dist.destroy_process_group()
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_pair(recorder: bool, calls: int, numel: int) -> float:
    """Seconds per all_reduce on rank 0 of a fresh pair of gloo ranks, the recorder on or off."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "64"
    port = str(_port())
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port, str(calls), str(numel)], env=env,
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    out = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    return float(out[0].strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--numel", type=int, default=1024)
    parser.add_argument("--json", default=None, metavar="NAME",
                        help="docs/figures/NAME.json (bare name) or a path; default benchmarks/results/")
    args = parser.parse_args(argv)
    on: list[float] = []
    off: list[float] = []
    for r in range(args.rounds):
        for recorder in ((True, False) if r % 2 == 0 else (False, True)):
            (on if recorder else off).append(one_pair(recorder, args.calls, args.numel))
        print(f"round {r + 1}: recorder on {on[-1] * 1e6:.1f} us, off {off[-1] * 1e6:.1f} us per all_reduce")
    paired = [b / a for a, b in zip(on, off)]
    result = {"calls": args.calls, "numel": args.numel, "rounds": args.rounds,
              "on_us": [round(x * 1e6, 2) for x in on], "off_us": [round(x * 1e6, 2) for x in off],
              "median_on_us": round(statistics.median(on) * 1e6, 2), "median_off_us": round(statistics.median(off) * 1e6, 2),
              "kept": round(statistics.median(off) / statistics.median(on), 4),
              "paired_kept": [round(min(paired), 4), round(statistics.median(paired), 4), round(max(paired), 4)],
              "conditions": harness.conditions(threads=1)}
    print(f"flight recorder: {result['median_on_us']} us on vs {result['median_off_us']} us off per all_reduce "
          f"of {args.numel} floats: {result['kept']:.3f}x kept (paired min/median/max {result['paired_kept']}); "
          f"CPU {result['conditions']['cpu'].get('kind')}, load {result['conditions']['loadavg']}")
    folder = harness.json_folder(args.json) if args.json else harness.RESULTS_DIR
    name = Path(args.json).stem if args.json else "flight_recorder"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {folder / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
