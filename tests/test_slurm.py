"""SLURM's ``srun`` under a real SLURM (issue 35): Debian's slurmctld and two slurmd ("node0", "node1") started
by this module on this machine, loopback only, 2 tasks per node, a CUDA-written DDP program unchanged.

- form A: ``srun -N2 -n4 --ntasks-per-node 2 python -m torch_adapter run --report-json rank-{rank}.json``, then
  ``torch-adapter report merge``: every rank adapted, named by SLURM's rank and node, one rank made to fall
  back on purpose (``torch.pdist`` on the simulated MPS) flagged with the op and its line;
- form B: ``torch-adapter run --report-json node.json srun …``: the tasks adapted through
  ``TORCH_ADAPTER_AUTOINSTALL`` (srun passes the environment), and a task whose environment lost it named
  as not adapted (exit 4) from srun's own count of tasks;
- the pure parts (srun's flags, SLURM's variables) run without SLURM.

The cluster: ``auth/none`` and ``cred/none`` (Debian's 22.05 build has both: no munge key, no munged),
``proctrack/linuxproc``, ``task/none``, ``select/cons_tres``, every path under the module's temporary folder,
ports from conftest's ``free_port``. Two slurmd on one host work because each has its own ``-N NAME``,
``Port`` and spool folder. docs/launchers.md, "SLURM `srun`", is the user's page for this.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import free_port

from torch_adapter.core.launcher_env import local_world_size, node_name, ranks
from torch_adapter.launch import job

_SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
SLURM = {name: shutil.which(name, path=_SBIN) for name in ("slurmctld", "slurmd", "srun", "sinfo", "squeue",
                                                          "scancel")}
needs_slurm = pytest.mark.skipif(
    not all(SLURM.values()),
    reason=f"SLURM is not installed ({', '.join(n for n, p in SLURM.items() if not p)} missing; Debian: "
           f"apt-get install slurmctld slurmd slurm-client, as .ci/run does)")

NODES = ("node0", "node1")
TASKS_PER_NODE = 2

DDP = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["SLURM_PROCID"])                     # the common SLURM pattern: its own variables
    world = int(os.environ["SLURM_NTASKS"])
    local = int(os.environ["SLURM_LOCALID"])
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    torch.cuda.set_device(local)                               # one GPU per task on its node
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 4, device="cuda") + rank            # different data per rank, same weights after
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    if rank == int(os.environ.get("FALLBACK_RANK", "-1")):
        torch.pdist(x)                                         # FALLBACK-LINE: the simulated MPS lacks it
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ws = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    t = torch.ones(1, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    os.write(1, f"rank {rank} of {world} local {local} node {os.environ['SLURMD_NODENAME']} "
                f"devices {torch.cuda.device_count()} sum {t.item():g} "
                f"same {all(torch.equal(ws[0], o) for o in ws)} on {t.device.type}\\n".encode())  # one write
    dist.destroy_process_group()
""")

# the portable pattern: CUDA when there is one, else the CPU and gloo — an unadapted task runs, silently
PORTABLE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
    t = torch.ones(1, device="cuda" if cuda else "cpu")
    dist.all_reduce(t)
    os.write(1, f"rank {dist.get_rank()} adapted {'torch_adapter' in sys.modules} sum {t.item():g}\\n".encode())
    dist.destroy_process_group()
""")

WRAPPER = textwrap.dedent("""\
    #!/bin/sh
    # a wrapper that drops the adapter's variable for one task (as `env -i`, a container entry point can)
    if [ "$SLURM_PROCID" = "3" ]; then unset TORCH_ADAPTER_AUTOINSTALL; fi
    exec {python} "$@"
""")

CONF = """\
ClusterName=adapter-test
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={node_ports[0]}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
InactiveLimit=0
KillWait=5
SlurmctldDebug=info
SlurmdDebug=info
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if "FALLBACK-LINE" in line)


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without the adapter's variable and without a surrounding SLURM job's (CI inside an
    allocation would otherwise run srun in that job)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL" and not k.startswith("SLURM")}
    env.update(PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1", **extra)
    return env


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    def env(self, **extra: str) -> dict[str, str]:
        path = os.pathsep.join([os.path.dirname(SLURM["srun"]), os.environ.get("PATH", "")])
        return _clean_env(SLURM_CONF=str(self.conf), PATH=path, **extra)

    def start(self) -> None:
        ports = [free_port() for _ in range(1 + len(NODES))]
        nodes = "\n".join(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={TASKS_PER_NODE} "
                          f"State=UNKNOWN" for n, p in zip(NODES, ports[1:]))
        (self.root / "state").mkdir()
        for n in NODES:
            (self.root / f"spool-{n}").mkdir()
        self.conf.write_text(CONF.format(root=self.root, ctld_port=ports[0], node_ports=ports[1:], nodes=nodes,
                                         names=",".join(NODES)))
        self._daemon("slurmctld", [SLURM["slurmctld"], "-D", "-f", str(self.conf)])
        for n in NODES:
            self._daemon(f"slurmd-{n}", [SLURM["slurmd"], "-D", "-f", str(self.conf), "-N", n])
        self._wait_idle(deadline=time.monotonic() + 60)

    def _daemon(self, name: str, cmd: list[str]) -> None:
        out = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        try:  # its own session: the teardown ends the daemon with everything in its group
            self.procs.append(subprocess.Popen(cmd, cwd=self.root, env=self.env(), stdin=subprocess.DEVNULL,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        finally:
            out.close()

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")))

    def _wait_idle(self, deadline: float) -> None:
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                pytest.fail(f"a SLURM daemon exited while starting: {dead}\n{self.logs()}", pytrace=False)
            res = subprocess.run([SLURM["sinfo"], "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True,
                                 text=True, timeout=30)
            states = dict(line.split(None, 1) for line in res.stdout.splitlines() if " " in line)
            if all(states.get(n, "").rstrip("*~#") == "idle" for n in NODES):
                return
            time.sleep(0.2)
        pytest.fail(f"SLURM's nodes did not become idle within 60 s (sinfo: {states})\n{self.logs()}", pytrace=False)

    def _own_stepds(self) -> list[int]:
        """slurmstepd processes of this cluster: they leave slurmd's session, so they are found by their
        working folder or an open file under this cluster's folder (never another cluster's)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip() != "slurmstepd":
                    continue
                paths = [os.readlink(proc / "cwd")] + [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            except OSError:
                continue
            if any(p.startswith(str(self.root)) for p in paths):
                found.append(int(proc.name))
        return found

    def stop(self) -> None:
        try:
            if self.conf.exists() and all(p.poll() is None for p in self.procs):
                subprocess.run([SLURM["scancel"], "--user", str(os.getuid())], env=self.env(), capture_output=True,
                               timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pid in self._own_stepds():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """slurmctld and two slurmd, up (both nodes idle in sinfo) for the module; ended even on a failure."""
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def work(tmp_path):
    for name, text in {"train.py": DDP, "portable.py": PORTABLE}.items():
        (tmp_path / name).write_text(text)
    wrap = tmp_path / "wrap.sh"
    wrap.write_text(WRAPPER.format(python=sys.executable))
    wrap.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    return tmp_path


def _run(cmd: list[str], cluster: Cluster, work: Path, **extra: str) -> subprocess.CompletedProcess:
    env = cluster.env(MASTER_PORT=str(free_port()), TMPDIR=str(work / "tmp"), **extra)
    res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=240)
    print(f"{' '.join(cmd[:8])} …: exit {res.returncode}")
    return res


def _srun(*args: str) -> list[str]:
    return ["srun", *args]  # by name, as a user types it (a path to a binary is read as a script by `run`)


def _adapter(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch_adapter", *args]


def _merge(work: Path, *files: str, output: str = "job.json") -> tuple[subprocess.CompletedProcess, dict]:
    res = subprocess.run(_adapter("report", "merge", *files, "--output", output), cwd=work, env=_clean_env(),
                         capture_output=True, text=True, timeout=120)
    path = work / output
    return res, json.loads(path.read_text()) if path.exists() else {}


def _check_training(res: subprocess.CompletedProcess) -> None:
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("rank "))
    assert [int(line.split()[1]) for line in lines] == [0, 1, 2, 3], res.stdout + res.stderr[-3000:]
    for rank, line in enumerate(lines):  # SLURM's block layout: ranks 0, 1 on node0; 2, 3 on node1
        node, local = divmod(rank, TASKS_PER_NODE)
        assert f" local {local} node node{node} devices {TASKS_PER_NODE} " in line, lines
    assert all(line.endswith(" sum 10 same True on cpu") for line in lines), lines  # equal weights everywhere


def _check_ranks(entries: list[dict]) -> None:
    assert [r["rank"] for r in entries] == [0, 1, 2, 3] and all(r["adapted"] for r in entries)
    assert [(r["node"], r["node_rank"], r["local_rank"]) for r in entries] == [
        (f"node{k // 2}", k // 2, k % 2) for k in range(4)]
    assert {r["launcher"] for r in entries} == {"srun"} and {r["world_size"] for r in entries} == {4}
    assert {r["local_world_size"] for r in entries} == {TASKS_PER_NODE}


@needs_slurm
def test_srun_two_nodes_launching_the_adapter_per_task_and_the_merge_flags_the_rank_that_fell_back(cluster, work):
    """Form A: `srun -N2 -n4 --ntasks-per-node 2 python -m torch_adapter run --report-json rank-{rank}.json`;
    {rank} is SLURM_PROCID, the node slurmd's name; rank 3 alone falls back; the merge flags it with its line."""
    started = time.monotonic()
    res = _run(_srun("-N2", "-n4", "--ntasks-per-node", "2", sys.executable, "-m", "torch_adapter", "run",
                     "--target", "mps", "--simulate", "--report-json", "rank-{rank}.json", "train.py"),
               cluster, work, FALLBACK_RANK="3")
    print(f"form A: {time.monotonic() - started:.1f} s")
    assert res.returncode == 0, res.stderr[-3000:] + cluster.logs()
    _check_training(res)
    merged, report = _merge(work, *(f"rank-{r}.json" for r in range(4)))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert report["schema"] == "torch-adapter.job-report" and report["world_size"] == 4 and report["ok"]
    _check_ranks(report["ranks"])
    assert [(n["node"], n["ranks"]) for n in report["nodes"]] == [("node0", [0, 1]), ("node1", [2, 3])]
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[3]["bytes_copied"] > 0 and all(by_rank[r]["bytes_copied"] == 0 for r in (0, 1, 2))
    (flagged,) = report["stragglers"]
    assert (flagged["rank"], flagged["node"], flagged["op"], flagged["route"]) == (
        3, "node1", "aten::_pdist_forward", "fallback")
    assert flagged["site"] == f"train.py:{_line(DDP)}" and flagged["usual_calls"] == 0
    assert "suspected straggler: rank 3 (node1, node rank 1, local rank 1)" in merged.stdout


@needs_slurm
def test_the_adapter_running_srun_adapts_every_task_on_both_nodes(cluster, work):
    """Form B: `torch-adapter run --report-json node.json srun -N2 -n4 python train.py`: srun passes
    TORCH_ADAPTER_AUTOINSTALL to every task; the report holds the whole job; rank 1 flagged."""
    started = time.monotonic()
    res = _run(_adapter("run", "--target", "mps", "--simulate", "--report", "--report-json", "node.json",
                        *_srun("-N2", "-n4", sys.executable, "train.py")), cluster, work, FALLBACK_RANK="1")
    print(f"form B: {time.monotonic() - started:.1f} s")
    assert res.returncode == 0, res.stderr[-3000:] + cluster.logs()
    _check_training(res)
    assert "is not a launcher the adapter knows" not in res.stderr
    assert "srun ran unadapted; adapted 4 process(es)" in res.stderr
    node = json.loads((work / "node.json").read_text())
    assert node["node"]["launcher"] == "srun" and node["node"]["expected_ranks"] == 4
    assert node["node"]["expected_local_ranks"] == 2  # -n 4 over -N 2
    whole = node["job"]
    assert whole["whole_job"] is True and whole["ok"] and whole["unadapted"] == []
    _check_ranks(whole["ranks"])
    (flagged,) = whole["stragglers"]
    assert (flagged["rank"], flagged["node"], flagged["op"]) == (1, "node0", "aten::_pdist_forward")
    assert flagged["site"] == f"train.py:{_line(DDP)}"
    assert "suspected straggler: rank 1 (node0, node rank 0, local rank 1)" in res.stderr
    merged, report = _merge(work, "node.json")  # the one file is the whole job
    assert merged.returncode == 0 and report["ok"] and [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3]


@needs_slurm
def test_a_task_that_runs_without_the_adapter_is_the_jobs_error(cluster, work):
    """A wrapper drops TORCH_ADAPTER_AUTOINSTALL for task 3; the portable program runs there plainly on the
    CPU and srun succeeds — the adapter's run does not: exit 4, rank 3 named with its node, from srun's -n."""
    res = _run(_adapter("run", "--report-json", "node.json",
                        *_srun("--nodes=2", "--ntasks=4", str(work / "wrap.sh"), "portable.py")), cluster, work)
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 4 and all(line.endswith("sum 4") for line in lines), res.stdout + res.stderr[-3000:]
    assert [line for line in lines if "adapted False" in line] == ["rank 3 adapted False sum 4"]
    assert res.returncode == job.EXIT_UNADAPTED, res.stderr[-3000:]
    assert "error: rank 3 (node1, node rank 1, local rank 1) did not run adapted: srun started 4 task(s)" in res.stderr
    node = json.loads((work / "node.json").read_text())
    (missing,) = node["job"]["unadapted"]
    assert (missing["rank"], missing["node"], missing["local_rank"]) == (3, "node1", 1) and not node["job"]["ok"]
    merged, report = _merge(work, "node.json")
    assert merged.returncode == job.EXIT_UNADAPTED, merged.stdout
    assert [u["rank"] for u in report["unadapted"]] == [3] and len(report["ranks"]) == 3


# -- the pure parts -------------------------------------------------------------------------------------


def test_srun_flags_give_the_tasks_in_all_and_per_node():
    assert job.expected_local(["srun", "-N2", "-n4", "--ntasks-per-node", "2", "python", "t.py"]) == 2
    assert job.expected_local(["/usr/bin/srun", "--nodes=2", "--ntasks=6", "python", "t.py"]) == 3
    assert job.expected_local(["srun", "-N", "2", "-n", "3", "python", "t.py"]) is None  # uneven: SLURM decides
    assert job.expected_local(["srun", "--ntasks-per-node=4", "python", "t.py"]) == 4
    assert job.expected_local(["srun", "-n4", "python", "t.py"]) is None  # nodes by free CPUs
    assert job.expected_tasks(["srun", "-n", "4", "python", "t.py"]) == 4
    assert job.expected_tasks(["srun", "-N", "2", "--ntasks-per-node", "2", "python", "t.py"]) == 4
    assert job.expected_tasks(["srun", "-N", "2-4", "python", "t.py"]) is None
    assert job.expected_tasks(["srun", "python", "t.py"]) is None  # the tasks' own world size then
    assert job.expected_tasks(["mpiexec", "-n", "4", "python", "t.py"]) is None


def test_slurms_variables_name_the_node_and_its_task_count():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURMD_NODENAME": "gpu7"}
    assert ranks(env) == {"launcher": "srun", "rank": 3, "world_size": 5, "local_rank": 0, "local_world_size": 1,
                          "node_rank": 2, "node": "gpu7"}
    assert local_world_size({**env, "SLURM_NODEID": "1"}) == 2 and local_world_size({**env, "SLURM_NODEID": "3"}) == 1
    assert local_world_size({**env, "SLURM_STEP_TASKS_PER_NODE": "garbled"}) == 1
    assert node_name({**env, "TORCH_ADAPTER_NODE": "mine"}) == "mine"  # the user's name first
    # torchrun inside an srun step: torchrun's count, SLURM's node name
    inner = ranks({**env, "RANK": "0", "LOCAL_WORLD_SIZE": "8"})
    assert (inner["launcher"], inner["local_world_size"], inner["node"]) == ("torchrun", 8, "gpu7")


def test_a_missing_task_is_named_by_its_global_rank_and_where_the_blocks_put_it():
    def rank(r: int) -> dict:
        return {"rank": r, "world_size": 4, "node": f"n{r // 2}", "node_rank": r // 2, "local_rank": r % 2,
                "local_world_size": 2, "adapted": True}

    (missing,) = job.missing_in_job([rank(0), rank(1), rank(3)], 4, "srun")
    assert (missing["rank"], missing["node"], missing["node_rank"], missing["local_rank"]) == (2, "n1", 1, 0)
    report = job.build([rank(0), rank(1), rank(3)], [missing])
    assert not report["ok"] and report["unadapted"][0]["label"] == "rank 2 (n1, node rank 1, local rank 0)"
    # a cyclic layout: the rank only, not a guessed node
    cyclic = [{**rank(r), "node_rank": r % 2, "node": f"n{r % 2}", "local_rank": r // 2} for r in (0, 1, 2)]
    (missing,) = job.missing_in_job(cyclic, None, "srun")  # no count from srun's args: the world size seen
    assert (missing["rank"], missing["node"], missing["local_rank"]) == (3, None, None)
    assert job.missing_in_job([rank(0), rank(1)], None, "srun") != []  # world size 4 names ranks 2, 3
