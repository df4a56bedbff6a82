"""Destroyed gloo groups: the adapter keeps alive only the ones it made gloo in place of nccl
(their destructor hangs after shutdown, redirect/distributed.py); a gloo group the program
asked for itself is freed as in plain torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import gc, socket, sys, torch, torch.distributed as dist, torch_adapter

    def port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    torch_adapter.install(target="cpu")
    kept = {}
    for backend in ("gloo", "nccl", "gloo"):
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port()}", rank=0, world_size=1)
        pg = dist.group.WORLD
        before = sys.getrefcount(pg)
        dist.destroy_process_group()
        gc.collect()
        kept.setdefault(backend, []).append(before - sys.getrefcount(pg))
        del pg
    print(kept)
    assert len(set(kept["gloo"])) == 1, kept               # the program's gloo groups: freed alike
    assert kept["gloo"][0] - kept["nccl"][0] == 1, kept     # one reference kept, for the nccl → gloo group only
    print("OK")
""")


def test_only_the_groups_the_adapter_made_gloo_are_kept_after_destroy():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr[-3000:]



def test_a_process_that_made_a_group_waits_a_moment_at_exit_until_uninstall(tmp_path):
    """The exit settle (redirect/distributed.py, GLOO_EXIT_SETTLE_S; it ended the SIGABRTs of gloo ranks
    at interpreter exit): registered with the first group made under the adapter, run once at exit, after
    the program's own exit handlers, and removed at uninstall. Seen through the settle's own sleep (a
    wall-clock bound failed on a loaded machine: interpreter teardown alone took 6 s there)."""
    script = textwrap.dedent("""
        import atexit, sys, time, torch.distributed as dist, torch_adapter
        from torch_adapter.redirect import distributed as d
        d.GLOO_EXIT_SETTLE_S = 0.01
        real_sleep = time.sleep
        def sleep(seconds):
            print(f"sleep {seconds}", flush=True)
            real_sleep(seconds)
        time.sleep = sleep  # the settle's sleep, seen (it reads time.sleep when it runs)
        torch_adapter.install(target="cpu")
        dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
        dist.new_group([0])
        dist.destroy_process_group()
        if sys.argv[2] == "uninstall":
            torch_adapter.uninstall()
        atexit.register(lambda: print("exiting", flush=True))
    """)
    seen = {}
    for mode in ("keep", "uninstall"):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"rdv-{mode}"), mode],
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        seen[mode] = out.stdout.splitlines()
    assert seen["keep"] == ["exiting", "sleep 0.01"], seen  # once, after the program's own handlers
    assert seen["uninstall"] == ["exiting"], seen
