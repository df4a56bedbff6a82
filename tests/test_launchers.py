"""Launchers: accelerate launch / torchrun adapt their ranks; --report shows what each rank did;
every process exits when its script ends; a launcher the adapter cannot adapt is named.

Real launchers (accelerate 1.15's ``accelerate launch``, torch's ``torchrun``), real gloo
process groups, fresh interpreters; docs/launchers.md is the user's page for this.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from conftest import free_port, run_cli

DDP_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def main():                                          # timm's shape: destroy, then return (DDP freed after)
      dist.init_process_group("nccl")                    # CUDA-written: nccl, cuda:LOCAL_RANK
      rank = dist.get_rank()
      torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
      model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[int(os.environ["LOCAL_RANK"])])
      data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4,
                                         num_workers=1, pin_memory=True)
      for (x,) in data:
          model(x.cuda(non_blocking=True)).sum().backward()
      t = torch.ones(4, device="cuda") * (rank + 1)
      dist.all_reduce(t)
      print(f"rank {rank} sum {t[0].item():g} on {t.device.type}", flush=True)
      w = torch.ones(3, device="cuda", requires_grad=True)
      loss = (w * (rank + 1)).sum()                      # accelerate's gather(loss.repeat(bs)) on a live loss
      out = torch.empty(2 * dist.get_world_size(), device="cuda")
      dist.all_gather_into_tensor(out, loss.repeat(2))
      print(f"rank {rank} gathered {out.tolist()}", flush=True)
      dist.destroy_process_group()

    main()
    print("main returned", flush=True)
""")

SPAWN_SCRIPT = textwrap.dedent("""
    import socket, torch, torch.distributed as dist, torch.multiprocessing as mp

    def work(rank, port):
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        t = torch.ones(3, device=f"cuda:{rank}")
        dist.all_reduce(t)
        print(f"spawned rank {rank} {t[0].item()}", flush=True)  # one write a line: both ranks print at once
        dist.destroy_process_group()                       # before returning: no group left at exit
        print(f"group destroyed: {not dist.is_initialized()}", flush=True)

    if __name__ == "__main__":
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        mp.spawn(work, args=(port,), nprocs=2)
""")

HANG_SCRIPT = textwrap.dedent("""
    import threading, torch
    x = torch.ones(2, device="cuda")
    threading.Thread(target=threading.Event().wait, name="never-ends").start()   # non-daemon, never joins
    print("script done", flush=True)
""")

HANG_EXIT_SCRIPT = HANG_SCRIPT + "import sys; sys.exit(3)\n"   # asks for 3, then hangs on the thread


@pytest.fixture
def scripts(tmp_path):
    for name, text in {"ddp.py": DDP_SCRIPT, "spawn.py": SPAWN_SCRIPT, "hang.py": HANG_SCRIPT, "hang_exit3.py": HANG_EXIT_SCRIPT}.items():
        (tmp_path / name).write_text(text)
    return tmp_path



LAUNCH = {
    "accelerate": ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())],
    "torchrun": ["torchrun", "--standalone", "--nproc-per-node", "2"],
}


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_run_launcher_adapts_each_rank_and_reports_per_rank(launcher, scripts):
    """`torch-adapter run --report LAUNCHER … ddp.py`: ranks adapted, one labelled report each, merged JSON."""
    out = scripts / "report.json"
    res = run_cli("run", "--report", "--report-json", str(out), *LAUNCH[launcher], str(scripts / "ddp.py"),
                  cwd=scripts, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 sum 3 on cpu" in res.stdout and "rank 1 sum 3 on cpu" in res.stdout
    assert "rank 1 gathered [3.0, 3.0, 6.0, 6.0]" in res.stdout  # gloo refuses a grad input; nccl does not
    assert res.stdout.count("main returned") == 2  # the DDP reducer freed after destroy_process_group
    assert f"{launcher} ran unadapted; adapted 2 process(es): rank 0 of 2" in res.stderr
    for rank in (0, 1):
        assert f"rank {rank} of 2 (pid" in res.stderr
    assert "all 2 processes together" in res.stderr
    assert "0 native · 0 composite" not in res.stderr
    payload = json.loads(out.read_text())
    ranks = [p for p in payload["processes"] if p["rank"] is not None]
    assert sorted(p["rank"] for p in ranks) == [0, 1]
    per_rank = [p["summary"] for p in ranks]
    assert all(s["native"] + s["composite"] > 0 for s in per_rank)
    assert payload["summary"] == {k: sum(s[k] for s in per_rank) for k in payload["summary"]}  # every route
    assert set(payload["summary"]) == {"native", "composite", "yours", "fallback", "refused"}
    assert any(e["asked"].startswith("init_process_group") and e["process"].startswith("rank 1") for e in
               payload["redirects"]), payload["redirects"]


def test_accelerate_launch_of_the_adapter_module(scripts):
    """The other documented form: `accelerate launch … -m torch_adapter run --report ddp.py`, reports labelled."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    res = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", *LAUNCH["accelerate"][2:], "-m",
                          "torch_adapter", "run", "--report", str(scripts / "ddp.py")], cwd=scripts, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 sum 3 on cpu" in res.stdout and "rank 1 sum 3 on cpu" in res.stdout
    assert "torch_adapter, rank 0 of 2 (pid" in res.stderr and "torch_adapter, rank 1 of 2 (pid" in res.stderr


def test_report_of_a_script_whose_work_runs_in_spawned_children(scripts):
    """mp.spawn ranks: the parent ran no ops, so the report shows the children, never an empty parent table;
    each child is labelled by the rank its (gloo) group had, although it destroyed the group before exit."""
    out = scripts / "spawn.json"
    res = run_cli("run", "--report", "--report-json", str(out), str(scripts / "spawn.py"), cwd=scripts, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("spawned rank") == 2
    assert res.stdout.count("group destroyed: True") == 2
    assert "rank 0 of 2 (pid" in res.stderr and "rank 1 of 2 (pid" in res.stderr  # not "pid N"
    assert res.stderr.index("rank 0 of 2 (pid") < res.stderr.index("rank 1 of 2 (pid")  # ranks in order
    assert "this process ran no ops itself; 2 adapted child process(es) did" in res.stderr
    assert "0 native · 0 composite" not in res.stderr
    payload = json.loads(out.read_text())
    assert payload["summary"]["native"] > 0
    workers = [p for p in payload["processes"] if p["summary"]]
    assert len(workers) == 2 and sorted(p["rank"] for p in workers) == [0, 1]
    assert all(p["label"].startswith(f"rank {p['rank']} of 2 (pid {p['pid']})") for p in workers)


def test_exit_is_bounded_after_the_script_ends(scripts):
    """A non-daemon thread that never ends: the process still exits, says what kept it, keeps the exit code."""
    res = run_cli("run", str(scripts / "hang.py"), env={"TORCH_ADAPTER_EXIT_TIMEOUT": "2"}, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "script done" in res.stdout
    assert "the script" in res.stderr and "has not exited; still alive: threads: never-ends" in res.stderr


def test_exit_of_an_adapted_child_is_bounded_too(scripts):
    res = run_cli("run", "torchrun", "--standalone", "--nproc-per-node", "1", str(scripts / "hang.py"),
                  env={"TORCH_ADAPTER_EXIT_TIMEOUT": "2"}, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "this adapted process ended" in res.stderr and "never-ends" in res.stderr


def test_a_bounded_child_keeps_the_exit_code_it_asked_for(scripts):
    """sys.exit(3), then a thread that never ends: the guard stops the wait for the thread and Python ends
    the child with its own 3, not 0 (torchrun would otherwise count a failed rank as a success)."""
    res = run_cli("run", "torchrun", "--standalone", "--nproc-per-node", "1", str(scripts / "hang_exit3.py"),
                  env={"TORCH_ADAPTER_EXIT_TIMEOUT": "2"}, timeout=180)
    assert "this adapted process ended" in res.stderr and "with the exit code Python gives it" in res.stderr, \
        res.stderr[-3000:]
    assert re.search(r"exitcode\s*: 3 ", res.stderr), res.stderr[-3000:]  # torchrun's account of its rank
    assert res.returncode != 0, res.stderr[-3000:]


def test_a_wrapper_the_adapter_does_not_know_is_named_with_what_was_adapted(scripts):
    res = run_cli("run", "bash", "-c", f"python {scripts / 'hang.py'} && echo wrapped-ok",
                  env={"TORCH_ADAPTER_EXIT_TIMEOUT": "2"}, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "'bash' is not a launcher the adapter knows" in res.stderr
    assert "bash ran unadapted; adapted 1 process(es): pid" in res.stderr
    assert "wrapped-ok" in res.stdout


def test_a_launcher_that_starts_no_python_child_says_nothing_ran_adapted(scripts):
    res = run_cli("run", "bash", "-c", "echo not-python", timeout=60)
    assert res.returncode == 0
    assert "not-python" in res.stdout
    assert "bash started no adapted process: nothing ran on the adapter" in res.stderr
    assert "Fix:" in res.stderr


def test_an_unknown_command_is_a_usage_error(scripts):
    res = run_cli("run", "no-such-launcher-xyz", "train.py", timeout=60)
    assert res.returncode == 2
    assert "expected a Python script, got 'no-such-launcher-xyz'" in res.stderr
