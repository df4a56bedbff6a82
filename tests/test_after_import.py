"""``_after_import.after_import``: a function run once a module is first imported (DTensor's
CPU attention rules wait for ``torch.distributed.tensor`` so). Found by notebook 03 under the
full suite: two sessions (an outer one suspended under an inner one) each waiting for the same
module made their finders search through each other until RecursionError, at an import deep
inside torch._dynamo."""

from __future__ import annotations

import sys
import types

from torch_adapter._after_import import after_import


def test_two_waiting_sessions_both_see_the_module_once(tmp_path, monkeypatch):
    (tmp_path / "ta_after_import_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    outer, inner = types.SimpleNamespace(closers=[]), types.SimpleNamespace(closers=[])
    seen: list[tuple[str, int]] = []
    after_import(outer, "ta_after_import_probe", lambda m: seen.append(("outer", m.VALUE)))
    after_import(inner, "ta_after_import_probe", lambda m: seen.append(("inner", m.VALUE)))
    try:
        import ta_after_import_probe  # noqa: F401
    finally:
        for close in outer.closers + inner.closers:
            close()
        sys.modules.pop("ta_after_import_probe", None)
    assert sorted(seen) == [("inner", 42), ("outer", 42)]
    assert not [f for f in sys.meta_path if type(f).__name__ == "_Finder"], "finders left behind"


def test_a_closed_session_is_not_called_and_an_imported_module_is_served_at_once(tmp_path, monkeypatch):
    (tmp_path / "ta_after_import_probe2.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    closed, seen = types.SimpleNamespace(closers=[]), []
    after_import(closed, "ta_after_import_probe2", lambda m: seen.append("closed"))
    for close in closed.closers:
        close()
    try:
        import ta_after_import_probe2  # noqa: F401
        after_import(types.SimpleNamespace(closers=[]), "ta_after_import_probe2", lambda m: seen.append(m.VALUE))
    finally:
        sys.modules.pop("ta_after_import_probe2", None)
    assert seen == [7]
