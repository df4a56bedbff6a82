"""Ray Train under the adapter (issue 35, items 1, 2): a real local Ray cluster, a CUDA-written training
function unchanged, ``TorchTrainer`` with ``ScalingConfig(num_workers=2, use_gpu=True)``.

One driver process (``torch-adapter run --target mps --simulate driver.py``) starts one local cluster
(``ray.init(num_cpus=2, include_dashboard=False)`` as written: under ``run`` it is the adapter's
``ray_train.init``, so the cluster has 2 CPUs and 2 "GPU"s, the target's device count) and runs two trainers
on it — the first as ``ray.train.torch.TorchTrainer`` unchanged (the adapter's once Ray is imported), the
second through ``ray_train.TorchTrainer(report_json=...)`` — so the slow Ray start-up is paid once:

- the CUDA-written function (``.cuda()``, ``device="cuda"``, ``prepare_model`` → DDP on ``cuda:<i>``, the
  ``"nccl"`` backend Ray picks for GPU workers), rank 1 alone calling ``torch.pdist`` (which the simulated
  MPS lacks): both workers adapted, equal weights after DDP, one job report (ranks 0 and 1, their
  records sent back through Ray, not the record folder) flagging rank 1 as a straggler with the op and line;
- a portable function (``"cuda" if torch.cuda.is_available() else "cpu"``, gloo) whose workers' runtime_env
  drops ``TORCH_ADAPTER_AUTOINSTALL``: it trains, plainly on the CPU, and the job report makes both ranks
  errors — the silent plain run the check exists for.

docs/launchers.md, "### Ray", is the user's page for this.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

ray_spec = __import__("importlib.util").util.find_spec("ray")
if ray_spec is None:
    pytest.skip("ray is not importable (pip install 'ray[train]'; it is in the dev extra)", allow_module_level=True)

from torch_adapter.launch import job

DRIVER = textwrap.dedent("""
    import json, os, sys, time
    started = time.monotonic()
    import torch, torch.distributed as dist
    import ray, ray.train, ray.train.torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig
    from torch_adapter.launch import ray_train

    OUT = sys.argv[1]

    def train_fn(config):                                   # CUDA-written, as for a GPU cluster
        from torch_adapter.session import current            # only to say whether this worker ran adapted
        rank = ray.train.get_context().get_world_rank()
        torch.manual_seed(0)
        model = ray.train.torch.prepare_model(torch.nn.Linear(4, 2).cuda())   # DDP on cuda:<local rank>
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(8, 4, device="cuda") + rank     # different data per rank, same weights after
            loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        if rank == config["fallback_rank"]:
            torch.pdist(x)                                   # FALLBACK-LINE: the simulated MPS lacks it
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        ws = [torch.empty_like(w) for _ in range(dist.get_world_size())]
        dist.all_gather(ws, w)
        t = torch.ones(1, device="cuda") * (rank + 1)
        dist.all_reduce(t)
        with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as fh:
            json.dump({"rank": rank, "world": dist.get_world_size(), "same": all(torch.equal(ws[0], o) for o in ws),
                       "sum": t.item(), "backend": dist.get_backend(), "ddp": type(model).__name__,
                       "device": str(ray.train.torch.get_device()), "cuda": torch.cuda.is_available(),
                       "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "adapted": current() is not None,
                       "weights": w.tolist()}, fh)

    def portable_fn(config):                                # runs anywhere: unadapted, silently on the CPU
        from torch_adapter.session import current            # (imported anyway: the trainer's wrapper is ours)
        rank = ray.train.get_context().get_world_rank()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = ray.train.torch.prepare_model(torch.nn.Linear(4, 2).to(device), move_to_device=False)
        model(torch.randn(2, 4, device=device)).sum().backward()
        with open(os.path.join(config["out"], f"portable{rank}.json"), "w") as fh:
            json.dump({"rank": rank, "cuda": torch.cuda.is_available(), "adapted": current() is not None}, fh)

    facts = {"imports_s": round(time.monotonic() - started, 1)}
    t = time.monotonic()
    try:                                                    # Ray's own names, unchanged: the adapter's under `run`
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as exc:                                # Ray's fixed 30 s for its raylet: a loaded machine
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        facts["init_retried"] = str(exc)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    facts.update(init_s=round(time.monotonic() - t, 1), resources=ray.cluster_resources())

    t = time.monotonic()
    trainer = ray.train.torch.TorchTrainer(                # the driver as written for a GPU cluster
        train_fn, train_loop_config={"fallback_rank": 1, "out": OUT},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        run_config=RunConfig(storage_path=os.path.join(OUT, "results")))
    trainer.fit()
    facts.update(fit_s=round(time.monotonic() - t, 1), rows=trainer.worker_rows)
    with open(os.path.join(OUT, "job.json"), "w") as fh:   # (the test reads the report the adapter kept)
        json.dump(trainer.job_report, fh)

    t = time.monotonic()
    plain = ray_train.TorchTrainer(
        portable_fn, train_loop_config={"out": OUT}, torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        run_config=RunConfig(storage_path=os.path.join(OUT, "results"),
                             worker_runtime_env={"env_vars": {"TORCH_ADAPTER_AUTOINSTALL": ""}}),
        report_json=os.path.join(OUT, "unadapted.json"))
    plain.fit()
    facts.update(plain_fit_s=round(time.monotonic() - t, 1), plain_rows=plain.worker_rows)
    ray.shutdown()
    facts["total_s"] = round(time.monotonic() - started, 1)
    with open(os.path.join(OUT, "facts.json"), "w") as fh:
        json.dump(facts, fh)
""")

# Ray Train's own background helpers, slowed down or left out (test speed only; none is the adapter's)
RAY_QUIET = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
             "RAY_TRAIN_ENABLE_STATE_TRACKING": "0", "RAY_USAGE_STATS_ENABLED": "0",
             "RAY_ADDRESS": "local"}  # a new cluster of the test's own, never one a `ray start` left on the machine


@pytest.fixture(scope="module")
def ray_job(tmp_path_factory):
    """Run the driver once (one local cluster); its files, stderr and wall time."""
    work = tmp_path_factory.mktemp("ray")
    (work / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_ADAPTER_AUTOINSTALL" and not k.startswith("RAY_")}
    env.update(RAY_QUIET, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "torch_adapter", "run", "--target", "mps", "--simulate",
                             "driver.py", str(work)], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the cluster it started
        out, err = proc.communicate()
        pytest.fail(f"the Ray driver did not end in 300 s:\n{err[-4000:]}")
    wall = time.monotonic() - started
    assert proc.returncode == 0, err[-6000:]
    return {"work": work, "stdout": out, "stderr": err, "wall_s": wall,
            "facts": json.loads((work / "facts.json").read_text())}


def _line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if "FALLBACK-LINE" in line)


@pytest.mark.slow
def test_ray_train_cuda_written_function_runs_adapted_on_both_workers(ray_job):
    """use_gpu=True is met by the cluster's 2 "GPU"s (the target's device count), each worker is adapted
    at start and trains through Ray's own GPU path (nccl → gloo, cuda:<i>, DDP); weights agree after DDP."""
    facts, work = ray_job["facts"], ray_job["work"]
    assert facts["resources"].get("GPU") == 2 and facts["resources"].get("CPU") == 2, facts["resources"]
    results = [json.loads((work / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, res in enumerate(results):
        assert res["adapted"] and res["cuda"] and res["world"] == 2, res
        assert res["backend"] == "gloo" and res["ddp"] == "DistributedDataParallel", res
        assert res["device"] == f"cuda:{r}" and res["visible"] == "0,1", res  # Ray's device per worker
        assert res["same"] and res["sum"] == 3.0, res
    assert results[0]["weights"] == results[1]["weights"]
    timings = {k: v for k, v in facts.items() if k.endswith("_s")}
    print(f"ray timings (s): {timings}; the driver's wall time {ray_job['wall_s']:.1f}")


@pytest.mark.slow
def test_one_job_report_lists_both_ranks_and_flags_the_rank_that_fell_back(ray_job):
    """The job report (launch/job.py, as for torchrun) from the records the workers sent back through Ray;
    rank 1 alone fell back (pdist on the simulated MPS): the suspected straggler, with the op and the line."""
    work, facts = ray_job["work"], ray_job["facts"]
    rows = facts["rows"]  # the records as they came back through Ray's object store, not the folder
    assert sorted(r["record"]["rank"] for r in rows if r["adapted"]) == [0, 1], rows
    assert all(r["record"].get("routing") for r in rows), "each worker's ops came back with its record"
    report = json.loads((work / "job.json").read_text())
    assert report["schema"] == job.SCHEMA and report["ok"] and report["world_size"] == 2
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["unadapted"] == []
    assert all(r["adapted"] and r["launcher"] == "ray train" and r["target"].startswith("mps") for r in report["ranks"])
    assert [r["local_rank"] for r in report["ranks"]] == [0, 1]
    assert [s["rank"] for s in report["stragglers"]] == [1], report["stragglers"]
    flagged = report["stragglers"][0]
    assert flagged["op"] == "aten::_pdist_forward" and flagged["route"] == "fallback"
    assert flagged["site"] == f"driver.py:{_line(DRIVER)}", flagged
    assert report["ranks"][1]["bytes_copied"] > 0 == report["ranks"][0]["bytes_copied"]
    err = ray_job["stderr"]
    assert "torch_adapter Ray Train job: 2 adapted rank(s) of 2 on 1 node(s)" in err, err[-3000:]
    assert "suspected straggler: rank 1" in err and "aten::_pdist_forward" in err
    merged = job.merge_files([str(work / "job.json")])  # `torch-adapter report merge` reads it as any job report
    assert [r["rank"] for r in merged["ranks"]] == [0, 1] and [s["rank"] for s in merged["stragglers"]] == [1]


@pytest.mark.slow
def test_a_ray_worker_without_the_adapter_is_the_jobs_error(ray_job):
    """The workers' runtime_env drops TORCH_ADAPTER_AUTOINSTALL: the portable function trains plainly on the
    CPU and Ray reports success; the job report names both ranks as not adapted, with the reason."""
    work, facts = ray_job["work"], ray_job["facts"]
    for r in (0, 1):
        ran = json.loads((work / f"portable{r}.json").read_text())
        assert ran == {"rank": r, "cuda": False, "adapted": False}, ran
    assert sorted(r["entry"]["rank"] for r in facts["plain_rows"]) == [0, 1]
    assert not any(r["adapted"] for r in facts["plain_rows"])
    report = json.loads((work / "unadapted.json").read_text())
    assert report["ok"] is False and report["ranks"] == []
    assert sorted(u["rank"] for u in report["unadapted"]) == [0, 1]
    assert all("no TORCH_ADAPTER_AUTOINSTALL in its environment" in u["why"] for u in report["unadapted"])
    err = ray_job["stderr"]
    assert "error: rank 0" in err and "did not run adapted" in err, err[-3000:]


def test_target_gpus_and_the_workers_environment_without_a_cluster():
    """What the helper decides, without Ray: a host target offers one "GPU" per CPU, a real accelerator
    its device count, real CUDA nothing; the user's own TORCH_ADAPTER_AUTOINSTALL in runtime_env wins."""
    from types import SimpleNamespace

    from torch_adapter.launch import ray_train

    def session(device_type: str, count: int = 1, simulated: bool = False, emulated: bool = False):
        return SimpleNamespace(target=SimpleNamespace(device_type=device_type, device_count=count,
                                                      simulated=simulated, emulated=emulated))

    assert ray_train.target_gpus(2, session("cpu")) == 2
    assert ray_train.target_gpus(3, session("cpu", simulated=True)) == 3
    assert ray_train.target_gpus(None, session("npu", 8)) == 8
    assert ray_train.target_gpus(2, session("cuda", 4)) is None
    settings = {"target": "cpu", "announce": "/tmp/x", "report": True, "make_folder": True}
    env = ray_train.worker_runtime_env({"pip": ["x"], "env_vars": {"A": "1"}}, settings)
    assert env["pip"] == ["x"] and env["env_vars"]["A"] == "1"
    assert json.loads(env["env_vars"]["TORCH_ADAPTER_AUTOINSTALL"]) == settings
    kept = ray_train.worker_runtime_env({"env_vars": {"TORCH_ADAPTER_AUTOINSTALL": ""}}, settings)
    assert kept["env_vars"]["TORCH_ADAPTER_AUTOINSTALL"] == ""
