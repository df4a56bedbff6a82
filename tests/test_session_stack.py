"""The session stack: nested adapted(), %%adapter_compare and %adapter target suspend the outer
session and resume it intact; a failed install leaves the previous session working; sessions
from .toml profiles round-trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter import optimize, register_fallback
from torch_adapter.errors import AdapterError, UsageError
from torch_adapter.routing.policy import policy_of

HEAVISIDE = "aten::heaviside"
pytestmark = pytest.mark.filterwarnings("ignore:configure\\(deny=:UserWarning")


def _doubled(module, x):
    return 2 * torch.nn.functional.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps)


def _outer():
    session = torch_adapter.install(target="mps", simulate=True, fallback="warn", deny=["aten::nonzero"])
    handle = register_fallback(HEAVISIDE, lambda x, values: x * 0 + 7)
    optimize.register(nn.LayerNorm, _doubled)
    session.redirect_log.note("device", "outer-marker", "cpu")
    return session, handle


def _check_outer_intact(session, handle):
    assert torch_adapter.current() is session and session.active and not handle.removed
    assert session.config.fallback == "warn" and session.target.label == "mps (simulated on cpu)"
    assert policy_of(session).fallback == "warn" and "aten::nonzero" in policy_of(session).deny
    assert torch.heaviside(torch.zeros(2), torch.ones(())).tolist() == [7.0, 7.0]  # the registration routes again
    ln, x = nn.LayerNorm(4), torch.randn(2, 4)
    torch.testing.assert_close(ln(x), 2 * torch.nn.functional.layer_norm(x, (4,), ln.weight, ln.bias))
    assert any(e.asked == "outer-marker" for e in session.redirect_log.entries())


def test_nested_adapted_suspends_and_resumes_the_outer_session_intact():
    session, handle = _outer()
    with torch_adapter.adapted(target="cpu", amp_dtype="float32") as inner:
        assert inner is not session and torch_adapter.current() is inner and session.suspended
        assert torch.heaviside(torch.zeros(2), torch.ones(())).tolist() == [1.0, 1.0]  # outer's fallback is off
        ln, x = nn.LayerNorm(4), torch.randn(2, 4)
        torch.testing.assert_close(ln(x), torch.nn.functional.layer_norm(x, (4,), ln.weight, ln.bias))
        with torch_adapter.adapted(target="cpu", amp_dtype="float16") as innermost:
            assert innermost.suspended is False and inner.suspended
        assert torch_adapter.current() is inner and inner.active
    assert inner.closed
    _check_outer_intact(session, handle)
    torch_adapter.uninstall()
    assert torch.heaviside(torch.zeros(2), torch.ones(())).tolist() == [1.0, 1.0] and handle.removed


def test_same_settings_share_the_session():
    session = torch_adapter.install(target="cpu")
    with torch_adapter.adapted(target="cpu") as inner:
        assert inner is session
    assert torch_adapter.current() is session and session.active


def test_compare_resumes_the_outer_session_intact():
    from torch_adapter.jupyter.compare import compare

    session, handle = _outer()
    result = compare(lambda: torch.ones(3).sum(), ["plain", "redirect", "mps-sim"], n=1, warmup=0)
    assert all(v["error"] is None for v in result.values()), result
    _check_outer_intact(session, handle)


def test_switch_suspends_and_switching_back_resumes():
    from torch_adapter.session import switch

    session, handle = _outer()
    other = switch("cpu")
    assert other.target.name == "cpu" and other.config.fallback == "warn" and session.suspended  # options carried
    assert switch("mps", simulate=True) is session
    _check_outer_intact(session, handle)
    torch_adapter.uninstall()
    assert other.closed and session.closed


@pytest.mark.parametrize(("options", "pattern"), [
    ({"force_cpu": ["aten::not_an_op"]}, r"force_cpu=\['aten::not_an_op'\]"),
    ({"propagate": "no"}, r"propagate=...\): expected one of False, True, got 'no'"),
    ({"target": "nup"}, r"install\(target=...\): expected one of auto"),
])
def test_a_failed_install_leaves_the_previous_session_working(options, pattern):
    session, handle = _outer()
    target = options.pop("target", "cpu")
    with pytest.raises(AdapterError, match=pattern):
        torch_adapter.install(target=target, **options)
    with pytest.raises(AdapterError, match=pattern):
        with torch_adapter.adapted(target=target, **options):
            pass
    _check_outer_intact(session, handle)


def test_configure_rejects_a_non_bool_propagate_and_changes_nothing():
    session = torch_adapter.install(target="cpu")
    with pytest.raises(UsageError, match=r"(?s)propagate=...\): expected one of False, True, got 'no' \(str\).*Why: "
                                         r"it decides whether child processes are adapted"):
        torch_adapter.configure(propagate="no")
    assert session.config.propagate is False and torch_adapter.current() is session


PROFILE = """
name = "mynpu"
dispatch_key = "PrivateUse1"
base = "mps"
"""


def test_a_toml_profile_session_round_trips(tmp_path):
    path = tmp_path / "mynpu.toml"
    path.write_text(PROFILE)
    session = torch_adapter.install(target=str(path), simulate=True)
    settings = json.loads(json.dumps(session.settings()))
    assert settings["target"] == str(path) and settings["simulate"] is True
    torch_adapter.uninstall()
    again = torch_adapter.install(**settings)
    assert again.target == session.target


def test_children_of_a_toml_simulation_are_adapted(tmp_path):
    path = tmp_path / "mynpu.toml"
    path.write_text(PROFILE)
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys
        code = "import torch_adapter; s = torch_adapter.current(); print('CHILD', s.target.label if s else None)"
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
    """))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_ADAPTER_AUTOINSTALL", None)
    out = subprocess.run([sys.executable, "-m", "torch_adapter", "run", "--target", str(path), "--simulate",
                          str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    assert "CHILD mynpu (simulated on cpu)" in out.stdout, out.stdout + out.stderr


def test_checking_a_real_target_under_an_engine_does_not_snapshot_its_kernels():
    """A real target's live profile is read once from the dispatcher: validating a new session's
    policy must not read it while the active (simulated) engine's kernels sit on the CPU key."""
    from torch_adapter.routing import profiles

    _outer()
    profiles.live_profile.cache_clear()
    with torch_adapter.adapted(target="cpu", force_cpu=["aten::mm"]):
        pass
    torch_adapter.uninstall()
    torch_adapter.install(target="cpu")
    register_fallback("aten::_fused_dropout", lambda x, p, generator=None: (x * 2, torch.ones_like(x, dtype=torch.bool)))
    out, _ = torch.ops.aten._fused_dropout(torch.ones(3), 0.5)  # CUDA-only op: the fallback routes it
    assert out.tolist() == [2.0, 2.0, 2.0]


def test_restore_is_all_or_nothing_and_names_every_failure():
    """A raising before_restore / after_restore no longer aborts Patcher.restore() halfway:
    every attribute is put back first, then one RestoreError names all the failures."""
    import types

    from torch_adapter.errors import RestoreError
    from torch_adapter.core.patching import Patcher

    owner = types.SimpleNamespace(a=1, b=2)
    p = Patcher()
    p.set(owner, "a", 10)
    p.set(owner, "b", 20)

    def broken_before(values):
        raise KeyError("before")

    def broken_after():
        raise OSError("after")

    ran = []
    p.before_restore(broken_before)
    p.after_restore(broken_after)
    p.after_restore(lambda: ran.append("second after"))
    with pytest.raises(RestoreError, match=r"2 failed.*broken_before.*KeyError.*broken_after.*OSError") as info:
        p.restore()
    assert (owner.a, owner.b) == (1, 2), "an attribute was left patched"
    assert ran == ["second after"]
    assert [type(e) for _, e in info.value.failures] == [KeyError, OSError]
    p.restore()  # nothing left: a second restore is a no-op


def test_a_failing_undo_of_a_failed_install_keeps_the_install_error(monkeypatch):
    import torch

    import torch_adapter
    from torch_adapter.redirect import env

    def broken_apply(session):
        session.patcher.after_restore(lambda: (_ for _ in ()).throw(OSError("undo broke")))
        raise ValueError("install broke")

    monkeypatch.setattr(env, "apply", broken_apply)
    with pytest.raises(ValueError, match="install broke") as info:
        torch_adapter.install(target="cpu")
    assert any("undo broke" in note for note in getattr(info.value, "__notes__", []))
    assert torch_adapter.session.current() is None
    assert torch.cuda.is_available() is False  # every patch of the failed install came off


def test_configure_is_atomic_when_applying_fails(monkeypatch):
    """configure() stored the new config before applying it: a failure half-applied it."""
    from torch_adapter.optimization import layer as optimizing

    session = torch_adapter.install(target="cpu")
    assert session.routing is None
    before = session.config

    def broken(session_, old):
        raise RuntimeError("optimization layer broke")

    monkeypatch.setattr(optimizing, "apply", broken)
    with pytest.raises(RuntimeError, match="optimization layer broke"):
        torch_adapter.configure(fallback="error", debug_mode=True)
    assert session.config is before and session.config.fallback == "allow"
    assert session.routing is None, "the routing engine attached for the failed settings stayed"
    monkeypatch.undo()
    assert torch.heaviside(torch.zeros(2), torch.ones(())).tolist() == [1.0, 1.0]
    torch_adapter.configure(fallback="warn")
    assert session.config.fallback == "warn"
