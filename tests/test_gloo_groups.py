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
    at interpreter exit): registered with the first group made under the adapter, run at exit, removed
    at uninstall. Timed from the program's last exit handler (registered after, so run before it) to the
    process's end, with the settle set to 1.5 s."""
    import time

    script = textwrap.dedent("""
        import atexit, sys, torch.distributed as dist, torch_adapter
        from torch_adapter.redirect import distributed as d
        d.GLOO_EXIT_SETTLE_S = 1.5
        torch_adapter.install(target="cpu")
        dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
        dist.new_group([0])
        dist.destroy_process_group()
        if sys.argv[2] == "uninstall":
            torch_adapter.uninstall()
        atexit.register(lambda: print("exiting", flush=True))
    """)
    waited = {}
    for mode in ("keep", "uninstall"):
        proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"rdv-{mode}"), mode],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "exiting\n"
        t0 = time.monotonic()
        assert proc.wait(timeout=120) == 0
        waited[mode] = time.monotonic() - t0
    assert waited["keep"] >= 1.5 > waited["uninstall"], waited
    assert waited["keep"] < 3.0, waited  # once
