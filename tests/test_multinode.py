"""Past one machine (issue 35, items 1, 2): several "nodes" on this machine, each its own launcher
process with its own environment (TORCH_ADAPTER_NODE, TMPDIR, HOSTNAME), loopback only, gloo.

- torchrun ``--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d``, both forms: ``torch-adapter run
  torchrun …`` on each node (form B) and ``torchrun … -m torch_adapter run`` (form A);
- Open MPI's ``mpiexec -n 4`` with a program that takes its ranks from ``OMPI_COMM_WORLD_*`` (skipped
  without openmpi-bin);
- a CUDA-written DDP program (``init_process_group("nccl")``, ``.cuda()``, ``device_ids``), unchanged;
- every rank's record says it ran adapted, and a rank that did not is the job's error (exit 4, named);
- ``torch-adapter report merge`` makes one job report, and a rank made to fall back on purpose
  (``torch.pdist`` on the simulated MPS, on that rank only) is flagged with the op and its line.

docs/launchers.md, "Past one machine", is the user's page for this.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import free_port

from torch_adapter.core.launcher_env import local_world_size, ranks
from torch_adapter.launch import job

DDP = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def main():
        dist.init_process_group("nccl")                       # CUDA-written: nccl, cuda:LOCAL_RANK
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[local])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(8, 4, device="cuda") + rank          # different data per rank, same weights after
            loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        if rank == int(os.environ.get("FALLBACK_RANK", "-1")):
            torch.pdist(x)                                     # FALLBACK-LINE: the simulated MPS lacks it
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        ws = [torch.empty_like(w) for _ in range(world)]
        dist.all_gather(ws, w)
        t = torch.ones(1, device="cuda") * (rank + 1)
        dist.all_reduce(t)
        os.write(1, f"rank {rank} of {world} group {os.environ.get('GROUP_RANK')} sum {t.item():g} "
                    f"same {all(torch.equal(ws[0], o) for o in ws)} on {t.device.type}\\n".encode())  # one write
        dist.destroy_process_group()

    main()
""")

# the portable pattern: CUDA when there is one, else the CPU and gloo — an unadapted rank runs, silently
PORTABLE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    model = DDP(torch.nn.Linear(4, 2).to(device))
    model(torch.randn(2, 4, device=device)).sum().backward()
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    os.write(1, f"rank {dist.get_rank()} adapted {'torch_adapter' in sys.modules} sum {t.item():g}\\n".encode())
    dist.destroy_process_group()
""")

MPI = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])            # the common pattern: Open MPI's variables
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    dist.init_process_group("nccl", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    torch.cuda.set_device(local)                              # one GPU per local rank
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 4, device="cuda") + rank
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    if rank == int(os.environ.get("FALLBACK_RANK", "-1")):
        torch.pdist(x)                                         # FALLBACK-LINE
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    t = torch.ones(1, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    os.write(1, f"rank {rank} of {world} local {local} sum {t.item():g} same {all(torch.equal(ws[0], o) for o in ws)} "
                f"on {t.device.type}\\n".encode())
    dist.destroy_process_group()
""")

WRAPPER = textwrap.dedent("""\
    #!/bin/sh
    # a wrapper that drops the adapter's variable for one rank (as `env -i`, a container entry point can)
    if [ "$TORCH_ADAPTER_NODE" = "node1" ] && [ "$LOCAL_RANK" = "1" ]; then unset TORCH_ADAPTER_AUTOINSTALL; fi
    exec {python} "$@"
""")


def _line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if "FALLBACK-LINE" in line)


@pytest.fixture
def work(tmp_path):
    for name, text in {"train.py": DDP, "portable.py": PORTABLE, "train_mpi.py": MPI}.items():
        (tmp_path / name).write_text(text)
    wrap = tmp_path / "wrap.sh"
    wrap.write_text(WRAPPER.format(python=sys.executable))
    wrap.chmod(0o755)
    return tmp_path


def _node_env(work: Path, k: int, **extra: str) -> dict[str, str]:
    """Node k's own environment: its name, host name and temporary folder; nothing adapted from outside."""
    tmp = work / f"node{k}-tmp"
    tmp.mkdir(exist_ok=True)
    env = {key: v for key, v in os.environ.items() if key != "TORCH_ADAPTER_AUTOINSTALL"}
    env.update(TORCH_ADAPTER_NODE=f"node{k}", HOSTNAME=f"node{k}", TMPDIR=str(tmp), PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1", **extra)
    return env


def _torchrun_args(port: int, k: int, run_id: str) -> list[str]:
    return ["--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--max-restarts", "0"]


def _two_nodes(commands: list[list[str]], envs: list[dict[str, str]], cwd: Path, timeout: int = 180):
    """Start every node's launcher at once (each its own process and environment); their results."""
    procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in zip(commands, envs)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _adapter(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch_adapter", *args]


def _merge(work: Path, *files: str, output: str = "job.json") -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    res = subprocess.run(_adapter("report", "merge", *files, "--output", output), cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    path = work / output
    return res, json.loads(path.read_text()) if path.exists() else {}


def _check_training(results) -> None:
    lines = [line for r in results for line in r.stdout.splitlines() if line.startswith("rank ")]
    assert sorted(int(line.split()[1]) for line in lines) == [0, 1, 2, 3], lines
    assert all(" sum 10 same True on cpu" in line for line in lines), lines  # weights equal on every rank


def test_torchrun_two_nodes_each_adapting_its_ranks_one_job_report_flags_the_rank_that_fell_back(work):
    """Form B on two nodes: `torch-adapter run --report-json node-{node}.json torchrun --nnodes 2 …` each;
    rank 3 alone calls an op the simulated MPS lacks; the merge flags rank 3 with the op and the line."""
    port = free_port()
    cmds = [_adapter("run", "--target", "mps", "--simulate", "--report", "--report-json", "node-{node}.json",
                     "torchrun", *_torchrun_args(port, k, "formb"), "train.py") for k in (0, 1)]
    results = _two_nodes(cmds, [_node_env(work, k, FALLBACK_RANK="3") for k in (0, 1)], work)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "torchrun ran unadapted; adapted 2 process(es)" in r.stderr
    _check_training(results)
    for k in (0, 1):
        node = json.loads((work / f"node-node{k}.json").read_text())
        assert node["node"]["node"] == f"node{k}" and node["node"]["expected_local_ranks"] == 2
        assert node["job"]["whole_job"] is False and node["job"]["unadapted"] == []
        assert [r["node"] for r in node["job"]["ranks"]] == [f"node{k}"] * 2
        assert sorted(r["local_rank"] for r in node["job"]["ranks"]) == [0, 1]
    res, report = _merge(work, "node-node0.json", "node-node1.json")
    assert res.returncode == 0, res.stderr + res.stdout
    assert report["schema"] == "torch-adapter.job-report" and report["world_size"] == 4 and report["ok"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3] and all(r["adapted"] for r in report["ranks"])
    assert {n["node"] for n in report["nodes"]} == {"node0", "node1"}
    assert all(len(n["ranks"]) == 2 for n in report["nodes"])
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[3]["bytes_copied"] > 0 and all(by_rank[r]["bytes_copied"] == 0 for r in (0, 1, 2))
    assert all(r["seconds"] > 0 and r["routes"]["native"] > 0 for r in report["ranks"])
    (flagged,) = report["stragglers"]
    line = _line(DDP)
    assert flagged["rank"] == 3 and flagged["op"] == "aten::_pdist_forward" and flagged["route"] == "fallback"
    assert flagged["site"] == f"train.py:{line}" and flagged["usual_calls"] == 0
    assert flagged["node"] == by_rank[3]["node"]
    assert "suspected straggler: rank 3" in res.stdout and f"train.py:{line}" in res.stdout
    # each node's own summary already names its differing rank
    node_of_3 = by_rank[3]["node"]
    assert "suspected straggler: rank 3" in results[int(node_of_3[-1])].stderr


def test_torchrun_two_nodes_launching_the_adapter_per_rank_merge_and_a_missing_rank(work):
    """Form A on two nodes: `torchrun --nnodes 2 … -m torch_adapter run --report-json rank-{rank}.json`;
    the merge of the four is clean; without one of them it names the missing rank (exit 4)."""
    port = free_port()
    cmds = [[sys.executable, "-m", "torch.distributed.run", *_torchrun_args(port, k, "forma"), "-m", "torch_adapter",
             "run", "--report-json", "rank-{rank}.json", "train.py"] for k in (0, 1)]
    results = _two_nodes(cmds, [_node_env(work, k) for k in (0, 1)], work)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
    _check_training(results)
    files = [f"rank-{r}.json" for r in range(4)]
    res, report = _merge(work, *files)
    assert res.returncode == 0, res.stderr + res.stdout
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3] and report["stragglers"] == []
    assert {r["node"] for r in report["ranks"]} == {"node0", "node1"}
    assert all(r["launcher"] == "torchrun" and r["world_size"] == 4 for r in report["ranks"])
    for node in ("node0", "node1"):  # node identity from each node's own environment, group rank from torchrun
        assert len({r["node_rank"] for r in report["ranks"] if r["node"] == node}) == 1
    res, report = _merge(work, *files[:3], output="partial.json")
    assert res.returncode == job.EXIT_UNADAPTED, res.stderr + res.stdout
    assert [u["rank"] for u in report["unadapted"]] == [3] and not report["ok"]
    assert "rank 3 (node ?) did not run adapted" in res.stdout


def test_a_rank_that_runs_without_the_adapter_is_the_jobs_error(work):
    """A wrapper drops TORCH_ADAPTER_AUTOINSTALL for node1's local rank 1; the portable program runs there
    plainly on the CPU and the job succeeds for torchrun — the adapter's run does not: exit 4, rank named."""
    port = free_port()
    cmds = [_adapter("run", "--report-json", "node-{node}.json", "torchrun", *_torchrun_args(port, k, "plain"),
                     "--no-python", str(work / "wrap.sh"), "portable.py") for k in (0, 1)]
    results = _two_nodes(cmds, [_node_env(work, k) for k in (0, 1)], work)
    lines = [line for r in results for line in r.stdout.splitlines() if line.startswith("rank ")]
    assert len(lines) == 4 and all(line.endswith("sum 4") for line in lines), lines
    (plain,) = [int(line.split()[1]) for line in lines if "adapted False" in line]  # torchrun's rank of it
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    assert results[1].returncode == job.EXIT_UNADAPTED, results[1].stderr[-3000:]
    assert f"error: rank {plain} (node1, node rank" in results[1].stderr
    assert "local rank 1) did not run adapted" in results[1].stderr
    node1 = json.loads((work / "node-node1.json").read_text())
    (missing,) = node1["job"]["unadapted"]
    assert missing["rank"] == plain and missing["local_rank"] == 1 and missing["node"] == "node1"
    res, report = _merge(work, "node-node0.json", "node-node1.json")
    assert res.returncode == job.EXIT_UNADAPTED, res.stdout
    assert [u["rank"] for u in report["unadapted"]] == [plain] and len(report["ranks"]) == 3
    assert f"error: rank {plain} (node1, node rank" in res.stdout


needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None,
                               reason="Open MPI's mpiexec is not installed (Debian: apt-get install openmpi-bin)")


def _mpi_env(work: Path, **extra: str) -> dict[str, str]:
    env = _node_env(work, 0, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_btl_vader_single_copy_mechanism="none", **extra)
    return env


def _mpiexec(port: int, *rest: str) -> list[str]:
    return ["mpiexec", "-n", "4", "--oversubscribe", "--bind-to", "none", "-x", "MASTER_ADDR=127.0.0.1",
            "-x", f"MASTER_PORT={port}", *rest]


@needs_mpi
def test_mpiexec_ranks_adapted_with_the_rank_that_fell_back_flagged(work):
    """Form B: `torch-adapter run --report-json node.json mpiexec -n 4 python train_mpi.py`; the program takes
    its ranks from OMPI_COMM_WORLD_*; each rank adapted, one device per local rank, rank 2 flagged."""
    res = subprocess.run(_adapter("run", "--target", "mps", "--simulate", "--report", "--report-json", "node.json",
                                  *_mpiexec(free_port(), "-x", "FALLBACK_RANK=2", sys.executable, "train_mpi.py")),
                         cwd=work, env=_mpi_env(work), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_training([res])
    assert "is not a launcher the adapter knows" not in res.stderr
    assert "mpiexec ran unadapted; adapted 4 process(es)" in res.stderr
    node = json.loads((work / "node.json").read_text())
    ranks_ = node["job"]["ranks"]
    assert [r["rank"] for r in ranks_] == [0, 1, 2, 3] and {r["launcher"] for r in ranks_} == {"mpi (Open MPI)"}
    assert [r["local_rank"] for r in ranks_] == [0, 1, 2, 3] and node["node"]["expected_local_ranks"] == 4
    (flagged,) = node["job"]["stragglers"]
    assert flagged["rank"] == 2 and flagged["op"] == "aten::_pdist_forward"
    assert flagged["site"] == f"train_mpi.py:{_line(MPI)}"
    assert "suspected straggler: rank 2" in res.stderr


@needs_mpi
def test_mpiexec_launching_the_adapter_per_rank_and_the_merge(work):
    """Form A: `mpiexec -n 4 python -m torch_adapter run --report-json rank-{rank}.json train_mpi.py`: {rank} is
    Open MPI's rank; the merge of the four files is the job."""
    res = subprocess.run(_mpiexec(free_port(), sys.executable, "-m", "torch_adapter", "run", "--report-json",
                                  "rank-{rank}.json", "train_mpi.py"),
                         cwd=work, env=_mpi_env(work), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_training([res])
    merged, report = _merge(work, *(f"rank-{r}.json" for r in range(4)))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3] and report["world_size"] == 4
    assert {r["launcher"] for r in report["ranks"]} == {"mpi (Open MPI)"} and report["stragglers"] == []


# -- the pure parts -------------------------------------------------------------------------------------


def test_each_launchers_variables_name_the_rank_and_the_devices():
    assert ranks({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                  "TORCH_ADAPTER_NODE": "a"}) == {"launcher": "torchrun", "rank": 3, "world_size": 4,
                                                  "local_rank": 1, "local_world_size": 2, "node_rank": 1, "node": "a"}
    mpi = ranks({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (mpi["launcher"], mpi["rank"], mpi["world_size"], mpi["local_rank"]) == ("mpi (Open MPI)", 5, 8, 1)
    assert local_world_size({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 4
    assert ranks({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})["node_rank"] == 1
    assert ranks({"PMI_RANK": "1", "PMI_SIZE": "2"})["launcher"] == "mpi (Hydra)"
    assert ranks({})["rank"] is None and local_world_size({}) == 1
    # torchrun inside an srun step: torchrun's variables win
    assert ranks({"RANK": "0", "SLURM_PROCID": "7"})["launcher"] == "torchrun"


def test_the_launchers_own_count_of_ranks_per_node():
    assert job.expected_local(["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"]) == 2
    assert job.expected_local(["torchrun", "--nproc_per_node=4", "t.py"]) == 4
    assert job.expected_local(["torchrun", "--nproc-per-node", "auto", "t.py"]) is None
    assert job.expected_local(["/usr/bin/mpiexec", "-np", "3", "python", "t.py"]) == 3
    assert job.expected_local(["accelerate", "launch", "--num_processes", "2", "t.py"]) is None


def _rank(rank: int, node: str, calls: dict[str, int]) -> dict:
    return {"rank": rank, "node": node, "node_rank": int(node[-1]), "local_rank": rank % 2, "world_size": 4,
            "adapted": True, "routes": {"native": 10, "fallback": sum(v for k, v in calls.items() if "fallback" in k)},
            "op_calls": {"native aten::mm": 10, **calls}, "sites": {k: ["train.py:9"] for k in calls},
            "fallbacks": [], "bytes_copied": 0, "pid": 100 + rank}


def test_stragglers_are_the_ranks_that_differ_from_most():
    same = {"fallback aten::nonzero": 2}
    report = job.build([_rank(0, "n0", same), _rank(1, "n0", same), _rank(2, "n1", {"fallback aten::nonzero": 5}),
                        _rank(3, "n1", same)])
    (s,) = report["stragglers"]
    assert (s["rank"], s["op"], s["calls"], s["usual_calls"], s["site"]) == (2, "aten::nonzero", 5, 2, "train.py:9")
    # two ranks that disagree: the one that did more is named
    (s,) = job.build([_rank(0, "n0", {}), _rank(1, "n0", same)], whole_job=False)["stragglers"]
    assert s["rank"] == 1
    assert job.build([_rank(0, "n0", same), _rank(1, "n0", same)], whole_job=False)["stragglers"] == []


def test_a_node_that_started_more_ranks_than_announced_names_them():
    ranks_ = [_rank(2, "n1", {})]
    missing = job.missing_on_node(ranks_, 2, "n1", "torchrun")
    assert [(m["rank"], m["local_rank"]) for m in missing] == [(3, 1)]
    report = job.build(ranks_, missing, whole_job=False)
    assert not report["ok"] and report["unadapted"][0]["label"] == "rank 3 (n1, node rank 1, local rank 1)"


def test_merge_refuses_what_is_not_a_report(tmp_path):
    bad = tmp_path / "plain.json"
    bad.write_text(json.dumps({"schema": "torch-adapter.routing-log", "ops": []}))
    with pytest.raises(job.MergeError, match="has no 'job' or 'process' entry"):
        job.merge_files([str(bad)])
    with pytest.raises(job.MergeError, match="expected a readable report file"):
        job.merge_files([str(tmp_path / "absent.json")])
    (tmp_path / "torn.json").write_text("{")
    with pytest.raises(job.MergeError, match="expected JSON"):
        job.merge_files([str(tmp_path / "torn.json")])
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL"}
    res = subprocess.run(_adapter("report", "merge", str(bad)), capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2 and "Fix:" in res.stderr and "Traceback" not in res.stderr
