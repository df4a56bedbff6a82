"""The factory set is complete (derived from torch's schemas) and warnings raised inside a
redirected call name the caller's line, not the adapter's."""

from __future__ import annotations

import inspect
import warnings

import torch

import torch_adapter


def _schema_factories() -> set[str]:
    """Every torch.<name> function whose aten schema has ``Device? device`` (torch's registry)."""
    names = {s.name[len("aten::"):] for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")
             and any(a.name == "device" and str(a.type) == "Optional[Device]" for a in s.arguments)}
    return {n for n in names if callable(getattr(torch, n, None)) and not inspect.isclass(getattr(torch, n))}


def test_every_schema_factory_is_redirected():
    expected = _schema_factories()
    assert {"_empty_affine_quantized", "_empty_per_channel_affine_quantized", "empty", "zeros_like"} <= expected
    with torch_adapter.adapted("cpu"):
        missing = sorted(n for n in expected if not hasattr(getattr(torch, n), "__torch_adapter_original__"))
        assert not missing, f"not redirected: {missing}"
        q = torch._empty_affine_quantized([2, 3], scale=2, zero_point=3, dtype=torch.quint8, device="cuda")
        pc = torch._empty_per_channel_affine_quantized(
            [2, 3], scales=torch.ones(2, dtype=torch.double), zero_points=torch.zeros(2, dtype=torch.long),
            axis=0, dtype=torch.quint8, device="cuda")
        assert (q.device.type, pc.device.type) == ("cpu", "cpu")


def _warned_at(fn) -> list[tuple[str, str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [(w.filename, str(w.message)[:40]) for w in caught]


def test_warnings_inside_redirected_calls_name_the_callers_line():
    here = __file__
    calls = [
        lambda: torch.tensor(torch.ones(2), device="cuda"),  # "To copy construct from a tensor..."
        lambda: torch.empty(3).new_tensor(torch.ones(2), device="cuda"),  # Tensor.new_* go through it too
    ]
    with torch_adapter.adapted("cpu"):
        for call in calls:
            sites = _warned_at(call)
            assert sites, "the call warns"
            assert all(f == here for f, _ in sites), sites
    # without the fix these name redirect/devices.py: the same calls on plain torch name this file
    # too, so the adapted run must not differ
    assert all(f == here for f, _ in _warned_at(lambda: torch.tensor(torch.ones(2))))


def test_warnings_inside_calls_passed_through_name_the_callers_line():
    """Plain CPU code under the adapter: the stand-in calls torch's function from its own frame,
    unredirected, and a C++ warning named redirect/devices.py (PyTorch's
    test_cpp_warnings_have_python_context, CPU class, failed under the adapter only)."""
    here = __file__
    calls = [
        lambda: torch.arange(0, 3, out=torch.empty(5)),  # "An output with one or more elements was resized"
        lambda: torch.tensor(torch.ones(2)),  # "To copy construct from a tensor..."
        lambda: torch.empty(3).new_tensor(torch.ones(2)),
    ]
    plain = [_warned_at(call) for call in calls]
    with torch_adapter.adapted("cpu"):
        adapted = [_warned_at(call) for call in calls]
        on_device = _warned_at(lambda: torch.arange(0, 3, out=torch.empty(5, device="cuda")))  # out= not redirected
    assert adapted == plain and all(f == here for sites in adapted for f, _ in sites), adapted
    assert all(adapted) and on_device == plain[0]


def test_a_passed_through_warning_is_shown_once_per_line_of_the_program():
    """The "default" action is per line of the program, as on plain torch: one line calling the
    stand-in twice warns once, a second line warns again."""
    def twice():
        for _ in range(2):
            torch.arange(0, 3, out=torch.empty(5))
        torch.arange(0, 3, out=torch.empty(5))

    def shown() -> list[int]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            twice()
        return [w.lineno for w in caught]

    plain = shown()
    with torch_adapter.adapted("cpu"):
        adapted = shown()
    assert adapted == plain and len(set(adapted)) == 2, (adapted, plain)


def test_reattribution_is_per_thread_and_leaves_the_warnings_state_as_it_was():
    """The re-attribution swaps no process-wide state: another thread's warnings, raised while
    redirected calls warn on this one, keep their own line and all arrive; the filters and the
    show function are torch's/Python's again after the session."""
    import threading

    filters, show = list(warnings.filters), warnings._showwarnmsg
    other_line: list[int] = []
    stop = threading.Event()

    def other() -> None:
        import inspect

        while not stop.is_set():
            other_line[:] = [inspect.currentframe().f_lineno + 1]
            warnings.warn("from the other thread", UserWarning)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_adapter.adapted("cpu"):
            worker = threading.Thread(target=other)
            worker.start()
            try:
                for _ in range(200):
                    torch.tensor(torch.ones(2), device="cuda")  # warns (copy construct)
            finally:
                stop.set()
                worker.join()
    mine = [w for w in caught if "copy construct" in str(w.message)]
    theirs = [w for w in caught if "other thread" in str(w.message)]
    assert len(mine) == 200 and all(w.filename == __file__ for w in mine)
    assert theirs and all(w.filename == __file__ and w.lineno == other_line[0] for w in theirs)
    assert warnings.filters == filters and warnings._showwarnmsg is show


def test_the_probe_silences_its_own_thread_only():
    import threading

    from torch_adapter.core.caller_warnings import silenced

    seen: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch_adapter.adapted("cpu"):
            with silenced():
                warnings.warn("silenced here", UserWarning)
                worker = threading.Thread(target=lambda: warnings.warn("another thread's", UserWarning))
                worker.start()
                worker.join()
            warnings.warn("after the block", UserWarning)
        seen = [str(w.message) for w in caught]
    assert seen == ["another thread's", "after the block"]
