"""Route decisions are plain data: explain() and choose_route() without running a kernel."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import torch_adapter
from torch_adapter import Route, RouteDecision, explain
from torch_adapter.errors import UsageError
from torch_adapter.routing import profiles, rules
from torch_adapter.routing.choose import choose_route, decide_name


@pytest.mark.parametrize("op, route, via, words", [
    ("aten::nonzero", Route.NATIVE, "MPS", "mps has its own MPS kernel"),
    ("aten::add.Tensor", Route.NATIVE, "MPS", "MPS kernel"),
    ("aten::t", Route.NATIVE, "view", "view op"),
    ("aten::sym_size.int", Route.NATIVE, "metadata", "reads the shape"),
    ("aten::clone", Route.COMPOSITE, "CompositeExplicitAutograd", "no MPS kernel; runs its CompositeExplicitAutograd"),
    ("aten::einsum", Route.COMPOSITE, "CompositeImplicitAutograd", "above autograd"),
    ("aten::heaviside", Route.COMPOSITE, "torch._decomp", "decomposes via torch._decomp (torch._refs"),
    ("aten::take", Route.COMPOSITE, "torch._decomp", "no MPS kernel; decomposes via torch._decomp"),
    ("aten::_linalg_eigh", Route.FALLBACK, "cpu", "no MPS kernel and no decomposition; runs on the CPU"),
    ("aten::_cudnn_rnn", Route.FALLBACK, "cpu", "the CPU has no kernel either"),
])
def test_explain_on_simulated_mps(op, route, via, words):
    d = explain(op, target="mps")
    assert isinstance(d, RouteDecision)
    assert (d.op, d.route, d.via) == (op, route, via)
    assert words in d.reason
    assert str(d).startswith(f"{op} -> {route.value}")


def test_route_values_and_decision_is_frozen():
    assert [r.value for r in Route] == ["native", "composite", "yours", "fallback", "refused"]
    d = explain("aten::nonzero", target="mps")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.route = Route.FALLBACK  # type: ignore[misc]


@pytest.mark.parametrize("spelling", ["aten::nonzero", "nonzero", "aten.nonzero.default", "torch.ops.aten.nonzero",
                                      torch.ops.aten.nonzero.default, torch.ops.aten.nonzero])
def test_op_spellings(spelling):
    assert explain(spelling, target="cuda").op == "aten::nonzero"


def test_same_op_on_other_targets():
    assert explain("aten::_linalg_eigh", target="cuda").route is Route.NATIVE
    assert explain("aten::nonzero", target="mtia").route is Route.FALLBACK
    assert explain("aten::mm", target="cpu").reason == "cpu has its own CPU kernel"  # the live host


def test_unknown_op_names_suggest():
    with pytest.raises(UsageError, match=r"(?s)explain\(\): expected an op this torch knows.*'aten::nonzerro'"
                                         r".*did you mean aten::nonzero"):
        explain("aten::nonzerro", target="mps")


def test_packet_with_many_overloads_asks_for_one():
    with pytest.raises(UsageError, match=r"(?s)names \d+ overloads.*aten::add\.Tensor"):
        explain("aten::add", target="mps")


def test_bad_argument_types():
    with pytest.raises(UsageError, match=r"expected an op name such as \"aten::nonzero\" or an OpOverload, got 3 \(int\)"):
        explain(3, target="mps")
    with pytest.raises(UsageError, match=r"target=\.\.\.\): expected a target name.*got 3\.5 \(float\)"):
        explain("aten::nonzero", target=3.5)


def test_choose_route_is_pure_and_cached():
    mps = profiles.load_profile("mps")
    first = choose_route(torch.ops.aten.heaviside.default, mps)
    assert choose_route("aten::heaviside", mps) is first  # one cached object
    hits = decide_name.cache_info().hits
    choose_route(torch.ops.aten.heaviside.default, mps)
    assert decide_name.cache_info().hits == hits + 1


def test_deny_list_has_reasons_and_is_honoured(tmp_path):
    assert all(len(reason) > 20 for reason in rules.TRAINING_UNSAFE_DECOMPOSITIONS.values())
    from torch_adapter.core.torch_private import decompositions

    # on a simulated accelerator the CPU's attention kernel is routed as the target's own member
    # (tests/test_routing_families.py); the deny-list applies where the op itself must run
    path = tmp_path / "cpu_minus.toml"
    path.write_text('name = "cpu-minus"\nbase = "cpu"\nnot_native = %s\n'
                    % str(list(rules.TRAINING_UNSAFE_DECOMPOSITIONS)).replace("'", '"'))
    for op in rules.TRAINING_UNSAFE_DECOMPOSITIONS:
        assert op in decompositions()  # the entry exists, so the deny-list matters
        d = explain(op, target=str(path))
        assert d.route is Route.FALLBACK and "training-unsafe deny-list" in d.reason


def test_explain_defaults_to_the_installed_target():
    assert "cpu has its own CPU kernel" in explain("aten::mm").reason  # nothing installed: this machine
    with torch_adapter.adapted(target="mps", simulate=True):
        assert explain("aten::heaviside").route is Route.COMPOSITE
        torch_adapter.configure(force_cpu=["aten::heaviside"])
        d = explain("aten::heaviside")
        assert d.route is Route.FALLBACK and "configure(force_cpu=...)" in d.reason


def test_decide_is_pure_its_answer_rests_on_its_arguments_alone():
    """decide() runs no probe and dispatches nothing: the self-decomposition fact is an argument
    (choose.decide_name supplies what the probe finds)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_adapter.routing import profiles, self_decomp
    from torch_adapter.routing.decide import Route, decide

    class Count(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    mtia = profiles.load_profile("mtia")
    name = "aten::var.correction"  # its decomposition re-enters var (prims.var -> torch.var)
    decide.cache_clear()
    self_decomp.calls_itself.cache_clear()
    with Count() as mode:
        plain = decide(name, mtia)
        told = decide(name, mtia, self_calling=frozenset({name}))
    assert mode.ops == [] and self_decomp.calls_itself.cache_info().currsize == 0
    assert plain.route is Route.COMPOSITE and plain.via == "torch._decomp"
    assert told.route is Route.FALLBACK and "calls the op itself" in told.reason
    assert decide_name(name, mtia).route is Route.FALLBACK  # the engine's route: the probe consulted
