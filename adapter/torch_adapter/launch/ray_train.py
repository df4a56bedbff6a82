"""Ray Train under the adapter: a CUDA-written ``TorchTrainer`` job, unchanged, on the target.

Ray starts its workers itself (a raylet per node, ``TorchTrainer`` making the process group from
inside each worker), so neither way the other launchers are adapted applies (docs/launchers.md,
"### Ray"). This module is the driver's side of it; the training function is not touched::

    from ray.train import ScalingConfig
    from torch_adapter.launch import ray_train

    ray_train.init(num_cpus=2)                         # instead of ray.init(...): a local cluster
    trainer = ray_train.TorchTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2, use_gpu=True))
    result = trainer.fit()                             # prints the job report; trainer.job_report: its dict

run as ``torch-adapter run [--target T] driver.py`` (or after ``torch_adapter.install(...)``).

**"GPU" resources.** ``use_gpu=True`` asks Ray for one ``GPU`` per worker. :func:`init` starts the
local cluster with ``num_gpus`` = the target's device count (a host target: one per CPU, as the
adapter gives one CUDA device per local rank), so the request is met as it is, and Ray takes its
GPU path unchanged: ``CUDA_VISIBLE_DEVICES`` per worker, backend ``"nccl"`` (the target's backend
under the adapter), ``get_device()`` = ``cuda:<local index>`` — each of which the adapter answers
as it does for any CUDA program. The other answer, rewriting ``use_gpu`` / ``resources_per_worker``
into the target's resource, was not taken: Ray then picks ``"gloo"`` and ``get_device()`` returns
the CPU device, so on a real accelerator (Ray's ``NPU`` resource) the model would silently train on
the host. On a cluster started with ``ray start``, give the nodes the same count
(``ray start --num-gpus N``); ``init(address=...)`` connects and leaves the resources as they are.

**Workers adapted.** :class:`TorchTrainer` (a ``ray.train.torch.TorchTrainer``) puts
``TORCH_ADAPTER_AUTOINSTALL`` (the driver's session's settings) into
``RunConfig.worker_runtime_env["env_vars"]``, so each train worker is adapted at interpreter start
by the ``.pth`` hook (launch/autoinstall.py); :func:`init` keeps the variable out of Ray's own
processes (raylet, GCS, idle workers). The function is wrapped, same signature, only to end each
worker's record (launch/child_report.py) when it returns: Ray ends train workers with ``ray.kill``,
so no ``atexit`` runs there.

**Records back to the driver.** A worker's record goes to the driver through a small named actor
(one per driver job; Ray's object store), because a worker on another node does not share the
driver's temporary record folder (each worker makes a folder of the same path locally: ``make_folder``). A worker that ran
without the adapter says so through the same actor; a rank that never reported is named too. The
driver builds the job report with launch/job.py — the same per-rank routes, stragglers and
unadapted-rank errors as a torchrun job — renders it and keeps it as ``trainer.job_report``
(``report_json=`` writes it; ``torch-adapter report merge`` reads it).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

from ..core.config import CHILD_SETTINGS_ENV as ENV_VAR
from ..core.config import encode_child_settings

# TorchTrainer: made on first use (module __getattr__), so that importing this module imports no ray
__all__ = ["LAUNCHER", "TorchTrainer", "init", "job_report", "target_gpus", "worker_runtime_env",  # noqa: F822
           "worker_settings"]

LAUNCHER = "ray train"  # the launcher's name in the job report
_NAMESPACE = "torch_adapter"  # where the records actor is named


def _session() -> Any:
    from ..core.state import current

    return current()


def target_gpus(num_cpus: int | None = None, session: Any = None) -> int | None:
    """How many ``GPU`` resources a local Ray node of the active session's target offers: its device
    count on a real accelerator; on a host target (the CPU, a simulated or emulated device) one per CPU
    (``num_cpus``, else the machine's), the adapter's one CUDA device per local rank. None: no session,
    or a real CUDA target (Ray counts those GPUs itself)."""
    session = session if session is not None else _session()
    if session is None:
        return None
    target = session.target
    if target.device_type == "cuda" and not target.simulated:
        return None
    if target.device_type == "cpu" or target.emulated:
        return int(num_cpus or os.cpu_count() or 1)
    return int(target.device_count)


def init(*args: Any, **kwargs: Any) -> Any:
    """``ray.init(*args, **kwargs)`` for a driver under the adapter: a local cluster it starts gets
    ``num_gpus`` = :func:`target_gpus` (unless given), and is started without ``TORCH_ADAPTER_AUTOINSTALL``
    in its environment, so Ray's own processes run unadapted (only :class:`TorchTrainer`'s workers are).
    Connecting to a running cluster (``address=``, ``RAY_ADDRESS``, one ``ray start`` left on this machine)
    keeps its resources: ``ray start --num-gpus N`` gives them there."""
    import ray

    starts = not args and kwargs.get("address") in (None, "local") and os.environ.get("RAY_ADDRESS", "local") in ("", "local")
    gpus = target_gpus(kwargs.get("num_cpus")) if starts and "num_gpus" not in kwargs else None
    kept = os.environ.pop(ENV_VAR, None)
    ray_init = _ray_init()
    try:
        if gpus is None:
            return ray_init(*args, **kwargs)
        try:
            return ray_init(*args, **kwargs, num_gpus=gpus)
        except ValueError as exc:  # ray.init() found a running cluster (`ray start`): its resources stand
            if "existing cluster" not in str(exc) or kwargs.get("num_cpus") is not None:
                raise
            return ray_init(*args, **kwargs)
    finally:
        if kept is not None:
            os.environ[ENV_VAR] = kept


def worker_settings(report: bool = True) -> dict[str, Any] | None:
    """What ``TORCH_ADAPTER_AUTOINSTALL`` carries to the workers: the settings ``torch-adapter run`` gave
    its children (with its record folder), else the active session's; plus ``report`` and ``make_folder``.
    None when the driver is not adapted."""
    raw = os.environ.get(ENV_VAR, "")
    if raw.strip().startswith("{"):
        settings = json.loads(raw)
    else:
        session = _session()
        if session is None:
            return None
        settings = session.settings()
    if not settings.get("announce"):
        from .child_report import new_folder

        settings["announce"] = new_folder()
    settings["report"] = bool(report or settings.get("report"))
    settings["make_folder"] = True
    return settings


def worker_runtime_env(runtime_env: Any = None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """``runtime_env`` (a dict or RuntimeEnv; None: empty) with ``TORCH_ADAPTER_AUTOINSTALL`` added to its
    ``env_vars`` — the user's own value of it wins (``""`` runs the workers unadapted)."""
    env = dict(runtime_env or {})
    settings = settings if settings is not None else worker_settings()
    if settings is not None:
        env["env_vars"] = {ENV_VAR: encode_child_settings(settings), **dict(env.get("env_vars") or {})}
    return env


# -- in the worker ---------------------------------------------------------------------------------

def _where() -> dict[str, Any]:
    """This train worker's place in the job, from Ray Train's context (the launch facts of a record)."""
    import ray.train

    from ..core.launcher_env import node_name

    ctx = ray.train.get_context()
    return {"launcher": LAUNCHER, "rank": ctx.get_world_rank(), "world_size": ctx.get_world_size(),
            "local_rank": ctx.get_local_rank(), "local_world_size": ctx.get_local_world_size(),
            "node_rank": ctx.get_node_rank(), "node": node_name()}


def _actor_name() -> str:
    """The records actor of this Ray job (the driver's; its train workers belong to the same job)."""
    import ray

    return f"torch-adapter-records-{ray.get_runtime_context().get_job_id()}"


def _report_back(key: str, state: str) -> None:
    """End this worker's record and hand it to the driver's records actor; say so when it ran unadapted."""
    import ray

    where = _where()
    try:
        from .child_report import finish_now

        record = finish_now(state, launch=where, rank=where["rank"], world_size=where["world_size"])
    except Exception as exc:  # noqa: BLE001 - the driver hears why
        record, problem = None, f"its record could not be ended ({type(exc).__name__}: {exc})"
    else:
        problem = None
    if record is not None:
        row = {"adapted": True, "record": record}
    else:
        why = problem or (f"the Ray worker (pid {os.getpid()}) ran without the adapter: "
                          + (f"{ENV_VAR} was set but did not adapt it (see the worker's log)"
                             if os.environ.get(ENV_VAR) else f"no {ENV_VAR} in its environment (a runtime_env "
                             f"that overrides it, a worker started outside this trainer)"))
        row = {"adapted": False, "entry": {**where, "pid": os.getpid(), "adapted": False, "why": why}}
    actor = ray.get_actor(_actor_name(), namespace=_NAMESPACE)
    ray.get(actor.put.remote(key, row), timeout=120)


def _wrap(train_fn: Callable[..., Any], key: str) -> Callable[..., Any]:
    """``train_fn`` with the same signature (Ray passes ``config`` by it), reporting back when it ends."""
    @functools.wraps(train_fn)
    def train_loop_per_worker(*args: Any, **kwargs: Any) -> Any:
        state = "finished"
        try:
            return train_fn(*args, **kwargs)
        except BaseException as exc:
            state = f"failed ({type(exc).__name__})"
            raise
        finally:
            try:
                _report_back(key, state)
            except Exception as exc:  # noqa: BLE001 - never replace the user's outcome
                print(f"torch_adapter: this Ray worker could not report to the driver ({type(exc).__name__}: "
                      f"{exc}); the job report will name its rank as missing", file=sys.stderr)

    return train_loop_per_worker


# -- in the driver ---------------------------------------------------------------------------------

def _records_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Records:  # per trainer, the rows its workers sent back, in arrival order (one actor per driver job)
        def __init__(self) -> None:
            self.rows: dict[str, list[dict[str, Any]]] = {}

        def put(self, key: str, row: dict[str, Any]) -> None:
            self.rows.setdefault(key, []).append(row)

        def take(self, key: str) -> list[dict[str, Any]]:
            return self.rows.pop(key, [])

    return Records.options(name=_actor_name(), namespace=_NAMESPACE, get_if_exists=True).remote()


def job_report(rows: list[dict[str, Any]], world_size: int | None, folder: str | None = None,
               overridden: str | None = None) -> dict[str, Any]:
    """The job report (launch/job.py) over the workers' rows, the records of this node's folder that no
    row holds (a worker that died before its function ended), and the ranks of ``world_size`` nobody
    reported (None: an elastic run, the world size the workers saw). ``overridden``: the workers' own ``TORCH_ADAPTER_AUTOINSTALL`` when the trainer's
    ``worker_runtime_env`` set one (it wins over the driver's), said in the missing ranks' reason."""
    from .child_report import collect
    from .job import build, rank_entry

    records = [r["record"] for r in rows if r.get("adapted")]
    unadapted = [dict(r["entry"]) for r in rows if not r.get("adapted")]
    seen = {(r.get("launch", {}).get("node"), r.get("pid")) for r in records}
    from ..core.launcher_env import node_name

    here = node_name()
    for r in collect(folder) if folder else []:
        if (here, r.get("pid")) in seen or r.get("role") != "main" or r.get("rank") is None:
            continue  # reported already, or not a train worker (a helper, a DataLoader worker)
        r["launch"] = {**(r.get("launch") or {}), "launcher": LAUNCHER, "node": here}
        records.append(r)
    ranked = [rank_entry(r) for r in records]
    known = {e["rank"] for e in ranked} | {u.get("rank") for u in unadapted}
    for rank in range(world_size or 0):
        if rank not in known:
            unadapted.append({"rank": rank, "world_size": world_size, "local_rank": None, "node": None,
                              "node_rank": None, "launcher": LAUNCHER, "adapted": False,
                              "why": f"Ray Train started {world_size} worker(s); rank {rank} never reported back "
                                     f"(it died, or its function did not end before the trainer stopped)"
                                     + (f"; the trainer's worker_runtime_env sets {ENV_VAR}={overridden!r} itself, "
                                        f"which wins over the driver's" if overridden is not None else "")})
    return build(ranked, unadapted, whole_job=True)


_ORIGINALS: dict[str, Any] = {}  # Ray's own ray.init and ray.train.torch.TorchTrainer, once patched


def patch_on_import(patcher: Any) -> None:
    """An unchanged driver under ``torch-adapter run`` or ``%load_ext``: once the program imports Ray,
    ``ray.init`` is :func:`init` and ``ray.train.torch.TorchTrainer`` is :class:`TorchTrainer` (each set
    on the session's patcher: undone with it; the import hook is core/after_import.py's)."""
    from ..core.after_import import after_import

    after_import(patcher, "ray", lambda module: _patch(patcher, module, "init", _ray_init_wrapper))
    after_import(patcher, "ray.train.torch", lambda module: _patch(patcher, module, "TorchTrainer",
                                                                   lambda _original: _trainer_class()))


def _patch(patcher: Any, module: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_torch_adapter_ray", False):
        return
    _ORIGINALS.setdefault(name, original)
    patcher.set(module, name, make(original))


def _ray_init_wrapper(original: Any) -> Any:
    @functools.wraps(original)
    def ray_init(*args: Any, **kwargs: Any) -> Any:
        return init(*args, **kwargs)

    ray_init._torch_adapter_ray = True  # type: ignore[attr-defined]
    return ray_init


def _ray_init() -> Any:
    import ray

    return _ORIGINALS.get("init") or ray.init


def _trainer_class() -> type:
    cached = globals().get("_TRAINER")
    if cached is not None:
        return cached
    from ray.train import RunConfig

    RayTorchTrainer = _ORIGINALS.get("TorchTrainer")  # noqa: N806 - Ray's class, before the patch
    if RayTorchTrainer is None:
        from ray.train.torch import TorchTrainer as RayTorchTrainer

    class TorchTrainer(RayTorchTrainer):
        """``ray.train.torch.TorchTrainer`` whose workers run adapted and whose ``fit()`` ends with the job
        report (``job_report``; ``report=False``: no op records, only who ran adapted; ``render=False``:
        not printed; ``report_json``: written there)."""

        def __init__(self, train_loop_per_worker: Callable[..., Any], *, run_config: Any = None,
                     report: bool = True, render: bool = True, report_json: str | None = None,
                     **kwargs: Any) -> None:
            self.job_report: dict[str, Any] | None = None
            self.worker_rows: list[dict[str, Any]] = []  # what each worker sent back (its record, or why not)
            scaling = kwargs.get("scaling_config")
            local_mode = scaling is not None and scaling.num_workers == 0  # the function runs in this process
            had_folder = os.environ.get(ENV_VAR, "").strip().startswith("{") and bool(
                json.loads(os.environ[ENV_VAR]).get("announce"))  # `torch-adapter run --report`'s own
            self._settings = None if local_mode else worker_settings(report)
            self._own_folder = self._settings is not None and not had_folder  # made here: removed after fit()
            self._overridden: str | None = None
            self._key = uuid.uuid4().hex  # this trainer's rows in the records actor
            self._render, self._report_json = render, report_json
            if self._settings is not None:
                run_config = run_config or RunConfig()
                run_config.worker_runtime_env = worker_runtime_env(run_config.worker_runtime_env, self._settings)
                ours = encode_child_settings(self._settings)
                theirs = run_config.worker_runtime_env["env_vars"][ENV_VAR]
                self._overridden = None if theirs == ours else theirs
                train_loop_per_worker = _wrap(train_loop_per_worker, self._key)
            elif not local_mode:
                print("torch_adapter: the Ray driver is not adapted (no session, no TORCH_ADAPTER_AUTOINSTALL): "
                      "its workers run without the adapter and no job report is made", file=sys.stderr)
            super().__init__(train_loop_per_worker, run_config=run_config, **kwargs)

        def fit(self) -> Any:
            if self._settings is None:
                return super().fit()
            import ray

            if not ray.is_initialized():
                init()
            actor = _records_actor()
            try:
                return super().fit()
            finally:
                try:
                    self.worker_rows = ray.get(actor.take.remote(self._key), timeout=120)
                except Exception as exc:  # noqa: BLE001 - the cluster went away: the report says no rank reported
                    print(f"torch_adapter: the workers' records could not be read back ({type(exc).__name__}: "
                          f"{exc})", file=sys.stderr)
                folder = self._settings["announce"]
                workers = self.scaling_config.num_workers
                self.job_report = job_report(self.worker_rows, workers if isinstance(workers, int) else None,
                                             folder, self._overridden)
                if self._own_folder:
                    import shutil

                    shutil.rmtree(folder, ignore_errors=True)
                self._show()

        def _show(self) -> None:
            job = self.job_report
            if job is None:
                return
            if self._report_json:
                from ..core.safe_io import write_text

                write_text(self._report_json, json.dumps(job, indent=1), call="torch_adapter Ray Train job report")
            if self._render:
                from rich.console import Console

                from .job import render

                render(job, Console(stderr=True, width=160), title="torch_adapter Ray Train job")

    TorchTrainer.__qualname__ = TorchTrainer.__name__ = "TorchTrainer"
    TorchTrainer.__module__ = __name__
    TorchTrainer._torch_adapter_ray = True  # type: ignore[attr-defined]
    globals()["_TRAINER"] = TorchTrainer
    return TorchTrainer


def __getattr__(name: str) -> Any:  # TorchTrainer is made on first use: importing this module imports no ray
    if name == "TorchTrainer":
        cls = _trainer_class()
        globals()["TorchTrainer"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
