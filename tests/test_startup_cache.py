"""The on-disk start-up cache (core/disk_cache.py, routing/route_cache.py), in fresh interpreters.

Each test gives the child its own cache folder (``TORCH_ADAPTER_CACHE_DIR``); conftest turns the
cache off for every other test."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# a simulated install and one routed op; what the child imported says what it computed:
# the probe runs decompositions (which import torch._dynamo), the op table parse imports yaml
INSTALL = """
import sys, torch, torch_adapter
torch_adapter.install(target="mps", simulate=True)
x = torch.ones(3, device="cuda")
print("result", float((x * 2).sum()))
print("overrides", len(torch_adapter.session.current().routing.overrides))
print("dynamo", "torch._dynamo" in sys.modules, "yaml", "yaml" in sys.modules)
"""


def child(code: str, cache: Path | str | None, *, off: bool = False, limit_bytes: int | None = None,
          timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_ADAPTER_")}
    env["PYTHONWARNINGS"] = "default"
    if cache is not None:
        env["TORCH_ADAPTER_CACHE_DIR"] = str(cache)
    if off:
        env["TORCH_ADAPTER_CACHE"] = "off"

    def limit() -> None:  # a "full disk": writes past limit_bytes fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                         preexec_fn=limit if limit_bytes is not None else None)
    assert out.returncode == 0, out.stderr
    return out


def facts(out: subprocess.CompletedProcess) -> dict[str, str]:
    return {ln.split()[0]: " ".join(ln.split()[1:]) for ln in out.stdout.splitlines() if ln.strip()}


def cache_warnings(out: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in out.stderr.splitlines() if "CacheWarning" in ln]


def entries(folder: Path) -> dict[str, Path]:
    return {p.name.split("-")[0]: p for p in folder.glob("*.json")}


def test_a_second_run_reads_what_the_first_computed(tmp_path):
    cache = tmp_path / "cache"  # missing: created
    first = facts(child(INSTALL, cache))
    assert first["dynamo"] == "True yaml True"  # cold: probed and parsed
    assert {"ops", "profile", "routes", "factories"} <= set(entries(cache))
    second = facts(child(INSTALL, cache))
    assert second["dynamo"] == "False yaml False"  # warm: no probe ran, the yaml was not parsed
    assert second["result"] == first["result"] == "6.0" and second["overrides"] == first["overrides"]


def test_a_changed_profile_is_a_miss(tmp_path):
    cache = tmp_path / "cache"
    profile = tmp_path / "p.toml"
    code = """
import torch_adapter
from torch_adapter.routing import choose, ops_table, profiles
p = profiles.load_profile(%r)
print("route", choose.decide_name("aten::heaviside", p).route.value)
choose.remember(p, ops_table.load_table())
"""
    profile.write_text('name = "p"\nbase = "mps"\n')
    assert facts(child(code.replace("heaviside", "nonzero") % str(profile), cache))["route"] == "native"
    profile.write_text('name = "p"\nbase = "mps"\nnot_native = ["aten::nonzero"]\n')
    assert facts(child(code.replace("heaviside", "nonzero") % str(profile), cache))["route"] == "fallback"
    assert len(list(cache.glob("routes-*.json"))) == 2  # one entry per profile content


def test_corrupt_and_foreign_entries_are_ignored_and_rewritten(tmp_path):
    cache = tmp_path / "cache"
    child(INSTALL, cache)
    files = entries(cache)
    files["routes"].write_text('{"schema": "torch-adapter.cache", "vers')  # torn
    files["ops"].write_bytes(b"\xff\x00garbage")
    doc = json.loads(files["profile"].read_text())
    doc["key"]["torch"] = "0.0.0"  # an entry for another torch under this name
    files["profile"].write_text(json.dumps(doc))
    again = child(INSTALL, cache)
    assert facts(again)["result"] == "6.0" and not cache_warnings(again)
    for name in ("routes", "ops", "profile"):
        assert json.loads(files[name].read_text())["schema"] == "torch-adapter.cache"  # rewritten whole
    assert facts(child(INSTALL, cache))["dynamo"] == "False yaml False"


def test_a_file_in_place_of_the_folder_warns_once_and_the_run_goes_on(tmp_path):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file")
    out = child(INSTALL, not_a_folder)
    assert facts(out)["result"] == "6.0"
    warned = cache_warnings(out)
    assert len(warned) == 1 and "is not a folder" in warned[0] and "TORCH_ADAPTER_CACHE_DIR" in warned[0]
    assert not_a_folder.read_text() == "a file"


def test_a_full_disk_warns_once_and_the_run_goes_on(tmp_path):
    cache = tmp_path / "cache"
    out = child(INSTALL, cache, limit_bytes=64 * 1024)  # the op table and the routes are larger: EFBIG
    assert facts(out)["result"] == "6.0"
    warned = cache_warnings(out)
    assert len(warned) == 1 and "cannot be used" in warned[0]
    assert "routes" not in entries(cache) and "ops" not in entries(cache)
    for path in cache.glob("*.json"):  # what was written is whole; no temporary file is left
        assert json.loads(path.read_text())["schema"] == "torch-adapter.cache"
    assert not list(cache.glob(".*.tmp"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_warns_once(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o500)
    out = child(INSTALL, cache)
    assert facts(out)["result"] == "6.0" and len(cache_warnings(out)) == 1


def test_turned_off_nothing_is_written(tmp_path):
    cache = tmp_path / "cache"
    out = child(INSTALL, cache, off=True)
    assert facts(out)["result"] == "6.0" and not cache.exists() and not cache_warnings(out)


DUMP = """
import json, sys
import torch_adapter
from torch_adapter.routing import choose, ops_table, profiles, route_cache, self_decomp
from torch_adapter.core import disk_cache
out = {}
for name in profiles.BUILTIN:
    p = profiles.load_profile(name)
    ops = list(ops_table.load_table())
    routes = {op: (lambda d: [d.op, d.route.value, d.reason, d.via])(choose.decide_name(op, p)) for op in ops}
    probes = {op: self_decomp.calls_itself(op, p) for op in ops if routes[op][3] == "torch._decomp"}
    choose.remember(p, ops)
    out[name] = {"fields": disk_cache.encode(route_cache._fields(p)), "routes": routes, "probes": probes}
out["table"] = {n: [sorted(e.keys), e.view, e.mutates, list(e.tags)] for n, e in ops_table.load_table().items()}
json.dump(out, open(sys.argv[-1] if len(sys.argv) > 1 else %r, "w"), sort_keys=True)
print("dynamo", "torch._dynamo" in sys.modules, "yaml", "yaml" in sys.modules)
"""


def test_cached_and_uncached_runs_give_identical_routes_for_every_builtin_profile(tmp_path):
    cache = tmp_path / "cache"
    dumps = {}
    for label, off in (("uncached", True), ("cold", False), ("warm", False)):
        path = tmp_path / f"{label}.json"
        out = child(DUMP % str(path), cache, off=off, timeout=600)
        dumps[label] = json.loads(path.read_text())
        if label == "warm":
            assert facts(out)["dynamo"] == "False yaml False"  # everything came from the cache
    assert set(dumps["uncached"]) == {"cuda", "mps", "mtia", "npu", "xpu", "cpu", "table"}
    assert dumps["warm"] == dumps["uncached"] and dumps["cold"] == dumps["uncached"]
