"""The adapter's one import hook (``_after_import.after_import``) under the session stack.

Found in use: two sessions (an outer one suspended under an inner one) each waiting for the
same module made their finders search through each other until RecursionError — first in
``_after_import`` (notebook 03, deep inside torch._dynamo), then in the probes' own copy of
that logic (``%adapter target mps --simulate`` then ``import transformers``). The hook now
exists once and belongs to the session's Patcher: suspended sessions have none on
``sys.meta_path``, a resumed one exactly one per module it waits for."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from torch_adapter.core.after_import import after_import, finders
from torch_adapter.core.patching import Patcher


def test_two_waiting_patchers_both_see_the_module_once(tmp_path, monkeypatch):
    (tmp_path / "ta_after_import_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    outer, inner = Patcher(), Patcher()
    seen: list[tuple[str, int]] = []
    after_import(outer, "ta_after_import_probe", lambda m: seen.append(("outer", m.VALUE)))
    after_import(inner, "ta_after_import_probe", lambda m: seen.append(("inner", m.VALUE)))
    assert len(finders()) == 2
    try:
        import ta_after_import_probe  # noqa: F401
    finally:
        outer.restore()
        inner.restore()
        sys.modules.pop("ta_after_import_probe", None)
    assert sorted(seen) == [("inner", 42), ("outer", 42)]
    assert not finders(), "finders left behind"


def test_a_restored_patcher_is_not_called_and_an_imported_module_is_served_at_once(tmp_path, monkeypatch):
    (tmp_path / "ta_after_import_probe2.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    restored, seen = Patcher(), []
    after_import(restored, "ta_after_import_probe2", lambda m: seen.append("restored"))
    restored.restore()
    assert not finders()
    try:
        import ta_after_import_probe2  # noqa: F401
        after_import(Patcher(), "ta_after_import_probe2", lambda m: seen.append(m.VALUE))
    finally:
        sys.modules.pop("ta_after_import_probe2", None)
    assert seen == [7]


_STACK_SCRIPT = textwrap.dedent("""
    import sys, torch, torch_adapter
    from torch_adapter import session
    from torch_adapter.core.after_import import finders

    def count(where):
        names = [f.name for f in finders()]
        assert len(names) == len(set(names)), (where, "two finders for one module", names)
        assert not [n for n in names if n in sys.modules], (where, "a finder for a loaded module", names)
        return len(names)

    torch_adapter.install(target="cpu")
    assert count("installed") >= 1              # probes wait for transformers/diffusers/accelerate
    for _ in range(3):
        with torch_adapter.adapted(target="mps", simulate=True):   # the outer session is suspended
            count("nested")
        count("resumed")
        with session.suspended():
            assert count("suspended") == 0
    session.switch("mps", simulate=True)
    session.switch("cpu")
    session.switch("mps", simulate=True)
    assert "transformers.utils.import_utils" in [f.name for f in finders()]
    count("switched")
    import transformers.utils.import_utils as iu  # the first import, after all the switching
    assert iu.is_flash_attn_2_available() is False
    torch_adapter.uninstall()
    assert count("uninstalled") == 0
    assert iu.is_flash_attn_2_available() is False  # the library's own answer on this machine
    print("OK")
""")


def test_switching_nesting_and_comparing_then_a_first_import_keeps_one_finder_each():
    out = subprocess.run([sys.executable, "-c", _STACK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]
