"""Where this process stands in a multi-process job, read from its launcher's environment.

Each launcher says it in its own variables; this table is the one place that reads them
(docs/launchers.md, "Past one machine"):

| launcher | rank | world | local rank | local world | node |
|---|---|---|---|---|---|
| torchrun / accelerate / deepspeed | ``RANK`` | ``WORLD_SIZE`` | ``LOCAL_RANK`` | ``LOCAL_WORLD_SIZE`` | ``GROUP_RANK`` |
| Open MPI ``mpiexec`` | ``OMPI_COMM_WORLD_RANK`` | ``…_SIZE`` | ``…_LOCAL_RANK`` | ``…_LOCAL_SIZE`` | – |
| MPICH / Intel MPI (Hydra) | ``PMI_RANK`` | ``PMI_SIZE`` | ``MPI_LOCALRANKID`` | ``MPI_LOCALNRANKS`` | – |
| SLURM ``srun`` | ``SLURM_PROCID`` | ``SLURM_NTASKS`` | ``SLURM_LOCALID`` | ``SLURM_STEP_TASKS_PER_NODE`` | ``SLURM_NODEID`` |

(``SLURM_STEP_TASKS_PER_NODE`` is SLURM's compact list, ``2(x2),1``: the local world is this node's entry,
``SLURM_NODEID``-th.) The first launcher whose rank variable is set wins, in that order (torchrun inside an
``srun`` step is torchrun's job). The adapter reads these for labels, reports and the
device count (one device per local rank); it never sets torch's ``RANK``/``WORLD_SIZE``
from them: ``init_process_group("env://")`` reads torch's variables only, on CUDA too, so a
program started by ``mpiexec`` passes its rank itself (or sets them), as it does on GPUs.

The node's name is ``TORCH_ADAPTER_NODE`` when set (several "nodes" on one machine, a
container whose host name is not the node's), else SLURM's name of the node a task runs on
(``SLURMD_NODENAME``, set by ``slurmd`` in every task and batch script), else the host name.
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["LAUNCHER_VARS", "ranks", "local_world_size", "node_name", "NODE_ENV"]

NODE_ENV = "TORCH_ADAPTER_NODE"
_SLURM_NODE_ENV = "SLURMD_NODENAME"  # slurmd's NodeName for this task: several slurmd on one host differ in it
_SLURM_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"

# launcher -> (rank, world size, local rank, local world size, node index) variables; None: not given
LAUNCHER_VARS: dict[str, tuple[str, str, str, str | None, str | None]] = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    "mpi (Open MPI)": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE", None),
    "mpi (Hydra)": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
    "srun": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", _SLURM_TASKS_PER_NODE, "SLURM_NODEID"),
}


def _int(name: str | None, env: Any) -> int | None:
    raw = env.get(name) if name else None
    if raw is None:
        return None
    raw = raw.strip()
    if name == _SLURM_TASKS_PER_NODE:
        return _slurm_tasks_here(raw, _int("SLURM_NODEID", env))
    return int(raw) if raw.isdigit() else None


def _slurm_tasks_here(compact: str, node: int | None) -> int | None:
    """This node's task count from SLURM's ``2(x3),1`` (2 tasks on each of 3 nodes, then 1); plain string
    operations only (torch.compile traces device_count() down to here)."""
    if node is None:
        return None
    for part in compact.split(","):
        count, _, times = part.partition("(x")
        repeat = times[:-1] if times.endswith(")") else "1"
        if not (count.isdigit() and repeat.isdigit()):
            return None
        if node < int(repeat):
            return int(count)
        node -= int(repeat)
    return None


def node_name(env: Any = None) -> str:
    env = os.environ if env is None else env
    return env.get(NODE_ENV) or env.get(_SLURM_NODE_ENV) or socket.gethostname()


def ranks(env: Any = None) -> dict[str, Any]:
    """``{"launcher", "rank", "world_size", "local_rank", "local_world_size", "node_rank", "node"}``
    from the first launcher whose rank variable is set (values None where it says nothing; launcher
    None outside any)."""
    env = os.environ if env is None else env
    for launcher, (rank, world, local, local_world, node) in LAUNCHER_VARS.items():
        if _int(rank, env) is not None:
            return {"launcher": launcher, "rank": _int(rank, env), "world_size": _int(world, env),
                    "local_rank": _int(local, env), "local_world_size": _int(local_world, env),
                    "node_rank": _int(node, env), "node": node_name(env)}
    return {"launcher": None, "rank": None, "world_size": None, "local_rank": None, "local_world_size": None,
            "node_rank": None, "node": node_name(env)}


def local_world_size(env: Any = None) -> int:
    """How many ranks the launcher started on this node (1 outside a launcher): the CPU target's and
    the emulated device's device count, one device per local rank as on a GPU node."""
    # Read without ranks(): torch.cuda.device_count() asks it inside compiled code, where dynamo cannot
    # trace ranks()' socket.gethostname() (fullgraph=True failed: "function marked as skipped").
    env = os.environ if env is None else env
    found = None
    for rank, _world, _local, local_world, _node in LAUNCHER_VARS.values():
        if _int(rank, env) is not None:
            found = _int(local_world, env)
            break
    if found is None:  # a local size without its launcher's rank (LOCAL_WORLD_SIZE set alone): still the count
        for _rank, _world, _local, local_world, _node in LAUNCHER_VARS.values():
            found = _int(local_world, env)
            if found is not None:
                break
    return max(1, found) if found else 1
