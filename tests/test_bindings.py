"""core.patching.bindings: the one scan of sys.modules for the places that hold an object, and the
one stand-in mark (mark_stand_in / original_of)."""

import sys
import types

import pytest

from torch_adapter.core.patching import STAND_IN, bindings, mark_stand_in, original_of


@pytest.fixture()
def modules():
    def fn():
        return 1

    made = {}
    for name in ("ta_pkg", "ta_pkg.home", "ta_pkg.user", "ta_other"):
        mod = types.ModuleType(name)
        mod.nothing = None  # None attributes: no binding of fn (a missing-value sentinel once matched them)
        made[name] = sys.modules[name] = mod
    made["ta_pkg.home"].fn = fn
    made["ta_pkg.user"].fn = fn  # `from ta_pkg.home import fn`
    made["ta_pkg.user"].alias = fn  # `from ta_pkg.home import fn as alias`
    made["ta_other"].fn = fn
    try:
        yield fn, made
    finally:
        for name in made:
            del sys.modules[name]


def test_every_binding_by_identity_within_a_package_and_under_a_name(modules):
    fn, made = modules
    everywhere = {(m.__name__, attr) for m, attr, _ in bindings(fn)}
    assert {("ta_pkg.home", "fn"), ("ta_pkg.user", "fn"), ("ta_pkg.user", "alias"), ("ta_other", "fn")} <= everywhere
    assert [(m.__name__, a) for m, a, _ in bindings(fn, within="ta_pkg", name="fn")] == [
        ("ta_pkg.home", "fn"), ("ta_pkg.user", "fn")]
    assert {(m.__name__, a) for m, a, _ in bindings(fn, within="ta_pkg")} == {
        ("ta_pkg.home", "fn"), ("ta_pkg.user", "alias"), ("ta_pkg.user", "fn")}
    assert bindings(lambda: 2, within="ta_pkg") == []
    assert bindings(fn, within="ta_pk") == []  # a package, not a name prefix


def test_the_stand_in_mark_names_torchs_own_through_nested_stand_ins():
    def original():
        pass

    def outer():
        pass

    def inner():
        pass

    assert original_of(original) is original
    mark_stand_in(outer, original)
    mark_stand_in(inner, outer)  # a second session's stand-in over the first's
    assert original_of(inner) is original and getattr(inner, STAND_IN) is original
