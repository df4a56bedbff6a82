"""Hang help (issue 35, item 3): a collective that times out, gathered into the job report — each rank's
last collectives from torch's flight recorder and its Python stack at the user's line.

- form B, ``torch-adapter run --report-json node.json torchrun --nproc-per-node 2 prog.py``: rank 1 sleeps
  before the 4th all_reduce; rank 0 times out there (gloo, 3 s); torchrun kills rank 1 with SIGTERM; the
  report names rank 1 as never having entered all_reduce #4, with its line, and rank 0's timeout with its line;
- form A, ``torchrun … -m torch_adapter run --report-json rank-{rank}.json`` then ``report merge``: the same;
- a rank killed at SIGTERM inside C (no Python handler runs) leaves faulthandler's stack, which is read back;
- the recorder's records in one real process; the cross-rank reading (mismatch, late) on records of two real
  single-rank runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import free_port

from torch_adapter.launch import hang

HANG = textwrap.dedent("""
    import os, time, datetime, torch, torch.distributed as dist

    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=3))   # CUDA-written
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    x = torch.ones(4, device="cuda")
    for step in range(4):
        if rank == 1 and step == 3:
            time.sleep(60)                                    # SLEEP-LINE: rank 1 never comes
        dist.all_reduce(x)                                    # REDUCE-LINE
    print("done", rank)
""")


def _line(text: str, tag: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if tag in line)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_ADAPTER_AUTOINSTALL", hang.FR_ENV)}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TMPDIR=str(tmp))
    return env


def _torchrun(port: int) -> list[str]:
    return ["torchrun", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0"]


def _check(job: dict, tmp: Path) -> None:
    found = job["hang"]["findings"]
    kinds = {(f["kind"], f["rank"]) for f in found}
    assert ("never entered", 1) in kinds and ("timed out", 0) in kinds, found
    never = next(f for f in found if f["kind"] == "never entered")
    assert never["collective"] == "all_reduce #4" and never["last_entered"] == "all_reduce #3", never
    assert never["site"]["line"] == _line(HANG, "SLEEP-LINE") and never["site"]["code"] == "time.sleep(60)", never
    assert "killed by SIGTERM" in never["why"]
    out = next(f for f in found if f["kind"] == "timed out")
    assert out["site"]["line"] == _line(HANG, "REDUCE-LINE") and out["collective"] == "all_reduce #4", out
    assert out["error"].startswith("RuntimeError: ") and "[" not in out["error"].split(":", 1)[1][:3], out
    assert job["hang"]["last"] == {"default_pg": "all_reduce #4"}
    by_rank = {r["rank"]: r for r in job["ranks"]}
    ops = [c["op"] for c in by_rank[0]["hang"]["collectives"]]
    assert ops and set(ops) == {"all_reduce"}, by_rank[0]["hang"]


@pytest.mark.timeout(180)
def test_the_adapter_running_torchrun_names_the_rank_that_never_came_and_where(tmp_path):
    (tmp_path / "prog.py").write_text(HANG)
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--report", "--report-json", "node.json",
                          *_torchrun(free_port()), "prog.py"], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=150)
    print(f"form B: {time.monotonic() - started:.1f} s, exit {res.returncode}")
    assert res.returncode == 1, res.stderr[-4000:]  # torchrun's own exit for a failed rank
    assert "ChildFailedError" in res.stderr and "torch_adapter/launch" not in res.stderr.split("ChildFailedError")[0]
    node = json.loads((tmp_path / "node.json").read_text())
    _check(node["job"], tmp_path)
    text = " ".join(res.stderr.split())
    assert (f"rank 1 never entered all_reduce #4, which rank(s) 0 waited in; its last was all_reduce #3; it was at "
            f"prog.py:{_line(HANG, 'SLEEP-LINE')} `time.sleep(60)` (killed by SIGTERM)") in text, res.stderr[-4000:]
    assert f"rank 0 timed out in all_reduce #4 at prog.py:{_line(HANG, 'REDUCE-LINE')}" in text
    assert "Killed by SIGTERM (its report written at the signal): rank 1" in text


@pytest.mark.timeout(180)
def test_torchrun_launching_the_adapter_per_rank_merges_the_hang_into_one_job_report(tmp_path):
    (tmp_path / "prog.py").write_text(HANG)
    res = subprocess.run([*_torchrun(free_port()), "-m", "torch_adapter", "run", "--report-json", "rank-{rank}.json",
                          "prog.py"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=150)
    assert res.returncode != 0, res.stderr[-3000:]
    assert {p.name for p in tmp_path.glob("rank-*.json")} == {"rank-0.json", "rank-1.json"}, res.stderr[-3000:]
    assert json.loads((tmp_path / "rank-1.json").read_text())["process"]["state"] == "killed (SIGTERM)"
    merged = subprocess.run([sys.executable, "-m", "torch_adapter", "report", "merge", "rank-0.json", "rank-1.json",
                             "--output", "job.json"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                            timeout=120)
    job = json.loads((tmp_path / "job.json").read_text())
    _check(job, tmp_path)
    assert "collective hang" in merged.stdout and "rank 1 never entered all_reduce #4" in " ".join(merged.stdout.split())


STUCK = textwrap.dedent("""
    import sys, time
    from torch_adapter.launch import hang

    def wait_in_c():
        time.sleep(120)                                       # STUCK-LINE (a blocking C call)

    hang.watch_sigterm(lambda facts: None, stack_file=sys.argv[1])
    print("ready", flush=True)
    wait_in_c()
""")


def test_a_rank_stuck_in_c_leaves_faulthandlers_stack_which_reads_back_as_its_line(tmp_path):
    prog, stack = tmp_path / "stuck.py", tmp_path / "1234.stack"
    prog.write_text(STUCK)
    proc = subprocess.Popen([sys.executable, str(prog), str(stack)], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # died by SIGTERM as it would have without the adapter
    finally:
        proc.kill()
    facts = hang.read_stack_file(str(stack))
    assert facts is not None, stack.read_text()
    assert [s["function"] for s in facts["stack"]] == ["<module>", "wait_in_c"], facts
    assert facts["site"]["line"] == _line(STUCK, "STUCK-LINE") and facts["site"]["code"] == "time.sleep(120)"
    assert hang.read_stack_file(str(tmp_path / "missing.stack")) is None


ONE_RANK = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    from torch_adapter.launch import hang

    undo = hang.enable_flight_recorder()          # before the group is made, as the adapter does
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
    x = torch.ones(3)
    dist.all_reduce(x)
    if sys.argv[2] == "gather":
        dist.all_gather([torch.empty(2)], torch.ones(2))
    else:
        dist.all_reduce(torch.ones(5))
    dist.barrier()
    print(json.dumps(hang.last_collectives()))
    dist.destroy_process_group()
    undo()
    assert hang.FR_ENV not in os.environ
""")


def _one_rank(tmp_path: Path, second: str) -> list[dict]:
    (tmp_path / "one.py").write_text(ONE_RANK)
    res = subprocess.run([sys.executable, "one.py", str(free_port()), second], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_flight_recorder_gives_each_collective_in_order_and_the_job_reads_mismatch_and_lateness(tmp_path):
    a = _one_rank(tmp_path, "reduce")
    assert [(c["op"], c["seq"], c["sizes"]) for c in a] == [("all_reduce", 1, [[3]]), ("all_reduce", 2, [[5]]),
                                                            ("barrier", 3, [])], a  # the last 3 of the group
    assert all(c["group"] == "default_pg" and c["entered_ns"] for c in a)
    b = _one_rank(tmp_path, "gather")
    second_a = next(c for c in a if c["sizes"] == [[5]])
    second_b = next(c for c in b if c["op"] != "all_reduce" and c["op"] != "barrier")
    assert second_a["seq"] == second_b["seq"] and second_b["op"].startswith("all_gather"), b
    # two ranks whose 2nd collective differed, the first then waiting there: a mismatch
    keep = second_a["seq"]
    ranks = [{"rank": 0, "hang": {"why": "collective failed", "collectives": [c for c in a if c["seq"] <= keep]}},
             {"rank": 1, "hang": {"why": "killed by SIGTERM", "collectives": [c for c in b if c["seq"] <= keep]}}]
    found = hang.job_findings(ranks)["findings"]
    (mismatch,) = [f for f in found if f["kind"] == "mismatch"]
    assert f"#{keep}" in mismatch["text"] and "all_reduce of [[5]]" in mismatch["text"], mismatch
    assert not [f for f in found if f["kind"] == "never entered"]
    # the same records, rank 1's entry 5 s later: late
    shifted = [{**c, "entered_ns": c["entered_ns"] + 5_000_000_000} for c in a if c["seq"] <= keep]
    ranks = [{"rank": 0, "hang": {"collectives": [c for c in a if c["seq"] <= keep]}},
             {"rank": 1, "hang": {"collectives": shifted}}]
    (late,) = [f for f in hang.job_findings(ranks)["findings"] if f["kind"] == "late"]
    assert late["rank"] == 1 and late["late_s"] == pytest.approx(5.0, abs=0.01)
    assert hang.job_findings([{"rank": 0}, {"rank": 1}]) is None  # no facts: nothing said
    assert hang.render_lines(None) == []


def test_only_collective_failures_are_hang_facts():
    assert hang.facts(exc=ValueError("bad shape")) is None
    assert hang.facts() is None
    try:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]")
    except RuntimeError as exc:
        got = hang.facts(exc=exc)
    assert got["error"] == "RuntimeError: Connection closed by peer [::1]" and not got["timeout"]
    assert got["site"]["function"] == "test_only_collective_failures_are_hang_facts"
