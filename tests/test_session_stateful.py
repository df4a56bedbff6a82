"""A stateful test of the session stack (Hypothesis ``RuleBasedStateMachine``).

Rules are what a notebook user does all day: install, nested ``adapted()`` blocks with other or
the same settings, ``%adapter target``-style switches, ``suspended()`` comparisons,
``configure(...)``, ``register_fallback``, ``optimize.register``, threads that run ops, and
uninstall. After every step the invariants hold: the active session is the one the model
expects, with its settings, registrations and policy in force; a suspended session patches
nothing; at most one import finder per module, none while nothing is active; behaviour probes
(factories, int ordinals, the meta device, autocast, threads) answer right; after the last
``uninstall()`` every attribute of torch the adapter patched is the original object again.

A first import of a library after switching needs a fresh interpreter each time: that is
``tests/test_after_import.py::test_switching_nesting_and_comparing_then_a_first_import_keeps_one_finder_each``.

CI runs a bounded number of examples; ``TORCH_ADAPTER_STATEFUL_EXAMPLES=200`` runs more.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field, replace

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import torch_adapter
from torch_adapter import optimize, register_fallback
from torch_adapter.core.after_import import finders
from torch_adapter.session import suspended, switch

HEAVISIDE = "aten::heaviside"
TARGETS = {"cpu": dict(target="cpu"), "mps-sim": dict(target="mps", simulate=True)}
EXAMPLES = int(os.environ.get("TORCH_ADAPTER_STATEFUL_EXAMPLES", "8"))


@dataclass(frozen=True)
class Expect:
    """What the model expects of the active session."""

    target: str  # a key of TARGETS
    fallback: str = "allow"
    fallback_fn: bool = False  # a register_fallback(HEAVISIDE) of this session
    layer_norm: bool = False  # an optimize.register(nn.LayerNorm) of this session
    key: int = field(default=0, compare=False)  # which session object (0: not known yet)


def _doubled(module, x):
    return 2 * torch.nn.functional.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps)


def _snapshot() -> dict[tuple[str, str], int]:
    import torch._dynamo  # noqa: F401 - its first import rebinds torch.manual_seed (torch's own change)

    spaces = {"torch": torch, "torch.Tensor": torch.Tensor, "torch.nn.Module": nn.Module,
              "torch.autograd": torch.autograd, "torch.distributed": torch.distributed}
    return {(where, name): id(value) for where, ns in spaces.items() for name, value in list(vars(ns).items())}


class SessionStack(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        torch_adapter.uninstall()
        self.original = _snapshot()
        self.blocks: list[tuple[contextlib.ExitStack, Expect | None, bool]] = []  # (block, what was active before, shared it)
        self.expect: Expect | None = None
        self.sessions: dict[int, object] = {}
        self._suspended_expect: dict[int, Expect] = {}  # what a switched-away session holds

    # -- helpers -----------------------------------------------------------------------
    def _settings(self, e: Expect) -> dict:
        return {**TARGETS[e.target], "fallback": e.fallback}

    def _bind(self) -> None:
        """Remember which session object the active expectation is."""
        session = torch_adapter.current()
        if self.expect is not None and session is not None:
            self.expect = replace(self.expect, key=id(session))
            self.sessions[id(session)] = session

    # -- rules -------------------------------------------------------------------------
    @precondition(lambda self: not self.blocks)
    @rule(name=st.sampled_from(sorted(TARGETS)), fallback=st.sampled_from(["allow", "warn"]))
    def install(self, name, fallback):
        new = Expect(name, fallback)
        same = self.expect is not None and (self.expect.target, self.expect.fallback) == (name, fallback)
        torch_adapter.install(**self._settings(new))
        self.expect = self.expect if same else new  # the same settings: the same session, registrations kept
        self._bind()

    @rule(name=st.sampled_from(sorted(TARGETS)), fallback=st.sampled_from(["allow", "warn"]))
    def enter_adapted(self, name, fallback):
        new = Expect(name, fallback)
        same = self.expect is not None and (self.expect.target, self.expect.fallback) == (name, fallback)
        block = contextlib.ExitStack()
        block.enter_context(torch_adapter.adapted(**self._settings(new)))
        # the same settings: the block shares the active session (docs: adapted()), so what the block
        # registers or configures stays on it after the block
        self.blocks.append((block, self.expect, same))
        self.expect = self.expect if same else new
        self._bind()

    @rule()
    def enter_suspended(self):
        block = contextlib.ExitStack()
        block.enter_context(suspended())
        self.blocks.append((block, self.expect, False))
        self.expect = None

    @precondition(lambda self: bool(self.blocks))
    @rule()
    def leave_block(self):
        block, before, shared = self.blocks.pop()
        block.close()
        self.expect = self.expect if shared else before

    @precondition(lambda self: not self.blocks and self.expect is not None)
    @rule(name=st.sampled_from(sorted(TARGETS)))
    def switch_target(self, name):
        if name == self.expect.target:
            switch(**TARGETS[name])
            return
        back = [s for s in self.sessions.values() if getattr(s, "suspended", False)
                and s.target.name == TARGETS[name]["target"] and s.target.simulated == ("simulate" in TARGETS[name])]
        switch(**TARGETS[name])
        session = torch_adapter.current()
        if back and session is back[-1]:  # switching back resumes the suspended session intact
            self.expect = self._suspended_expect.pop(id(session), Expect(name, self.expect.fallback))
        else:
            self._suspended_expect[self.expect.key] = self.expect
            self.expect = Expect(name, self.expect.fallback)  # options carried, registrations not
        self._bind()

    @precondition(lambda self: self.expect is not None)
    @rule(fallback=st.sampled_from(["allow", "warn"]))
    def configure(self, fallback):
        torch_adapter.configure(fallback=fallback)
        self.expect = replace(self.expect, fallback=fallback)
        if self.expect.key in self._suspended_expect:
            self._suspended_expect.pop(self.expect.key)

    @precondition(lambda self: self.expect is not None and not self.expect.fallback_fn)
    @rule()
    def register_fallback_fn(self):
        register_fallback(HEAVISIDE, lambda x, values: x * 0 + 7)
        self.expect = replace(self.expect, fallback_fn=True)

    @precondition(lambda self: self.expect is not None and not self.expect.layer_norm)
    @rule()
    def register_layer_norm(self):
        optimize.register(nn.LayerNorm, _doubled)
        self.expect = replace(self.expect, layer_norm=True)

    @rule()
    def thread_runs_ops(self):
        seen: list = []

        def work():
            try:
                a = torch.ones(4, 4, device="cuda")
                seen.append((torch.mm(a, a).device.type, float(torch.mm(a, a)[0, 0])))
            except Exception as exc:  # no session: a CPU torch has no CUDA
                seen.append(type(exc).__name__)

        t = threading.Thread(target=work)
        t.start()
        t.join()
        assert seen == ([("cpu", 4.0)] if self.expect is not None else [seen[0]]) and (
            self.expect is not None or isinstance(seen[0], str)), seen

    @precondition(lambda self: not self.blocks)
    @rule()
    def uninstall(self):
        torch_adapter.uninstall()
        self.expect = None
        self._suspended_expect.clear()
        assert _snapshot_changes(self.original) == [], "attributes of torch not restored"
        assert not finders()

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def active_session_is_the_expected_one(self):
        session = torch_adapter.current()
        if self.expect is None:
            assert session is None, session
            return
        assert session is not None and session.active
        assert session.target.name == TARGETS[self.expect.target]["target"]
        assert session.target.simulated == ("simulate" in TARGETS[self.expect.target])
        assert session.config.fallback == self.expect.fallback
        if self.expect.key:
            assert id(session) == self.expect.key, "another session object than the one the model expects"
        for other in self.sessions.values():
            if other is not session and not other.closed:
                assert other.suspended and len(other.patcher) == 0, "a suspended session patches something"

    @invariant()
    def one_finder_per_module_and_none_without_a_session(self):
        names = [f.name for f in finders()]
        assert len(names) == len(set(names)), names
        if self.expect is None:
            assert names == [], names

    @invariant()
    def behaviour_probes_answer_right(self):
        active = self.expect is not None
        assert torch.cuda.is_available() is active
        with torch.device("meta"):
            assert torch.empty(2).is_meta
        if active:
            assert torch.zeros(1, device="cuda").device.type == "cpu"
            assert torch.ones(1).to(0).device.type == "cpu"
            with torch.autocast("cuda", dtype=torch.bfloat16):
                assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
        else:
            with pytest.raises((RuntimeError, AssertionError)):
                torch.zeros(1, device="cuda")
        x = torch.heaviside(torch.zeros(2), torch.ones(()))
        lacks = active and self.expect.target == "mps-sim"  # register_fallback serves a target that lacks the op
        assert x.tolist() == ([7.0, 7.0] if lacks and self.expect.fallback_fn else [1.0, 1.0])
        ln, y = nn.LayerNorm(4), torch.randn(2, 4)
        plain = torch.nn.functional.layer_norm(y, (4,), ln.weight, ln.bias)
        torch.testing.assert_close(ln(y), 2 * plain if active and self.expect.layer_norm else plain)

    def teardown(self):
        while self.blocks:
            self.blocks.pop()[0].close()
        torch_adapter.uninstall()
        assert _snapshot_changes(self.original) == [], "attributes of torch not restored after the last uninstall"
        assert not finders()


def _snapshot_changes(original: dict[tuple[str, str], int]) -> list[tuple[str, str]]:
    now = _snapshot()
    return sorted(k for k, v in original.items() if now.get(k) != v)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_session_stack_state_machine():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        SessionStack.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=10, deadline=None,
                                                  suppress_health_check=list(HealthCheck))
        SessionStack.TestCase().runTest()
