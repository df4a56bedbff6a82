"""A level's unproven parts are measured on the program's own step and kept only when they win (issue 38;
optimization/trial.py): autocast where the CPU has bf16 units, torch.compile on every CPU.

The real step of a real model; which way a trial goes depends on this machine's CPU, so the tests assert
that the decision follows the medians it measured (and that the model runs as decided), not a fixed outcome.
The Trial's schedule and rule are also checked with given times.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter.core.cpu_features import forced
from torch_adapter.optimization import layer as optimizing
from torch_adapter.optimization.levels import OptimizeWarning
from torch_adapter.optimization.trial import ENV, MARGIN, ORDER, Trial

pytestmark = pytest.mark.cpu_kind


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to("cuda")


def _train(model: nn.Module, steps: int) -> list[bool]:
    """``steps`` AdamW steps; per step, whether the inner Linear ran under CPU autocast."""
    seen: list[bool] = []
    handle = model[0].register_forward_pre_hook(lambda m, a: seen.append(torch.is_autocast_enabled("cpu")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(128, 256, device="cuda")
    try:
        for _ in range(steps):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        handle.remove()
    return seen


def _trial_rows() -> list[dict]:
    return [r for r in optimizing.applied() if r["what"].startswith("trial:")]


def test_autocast_on_a_bf16_kind_is_tried_on_the_step_and_kept_only_if_it_measured_faster():
    with forced("avx512_bf16"):
        session = torch_adapter.install(target="cpu", optimization_level="balanced")
        assert optimizing.plan_for(session)["trial"] == ("autocast",)
    try:
        model = _model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seen = _train(model, 14)
        (row,) = _trial_rows()
        assert row["trial"] == "autocast" and row["steps"] == len(ORDER)
        assert row["cpu_kind"] == "avx512_bf16, forced by TORCH_ADAPTER_CPU_FEATURES=avx512_bf16"
        assert row["kept"] == (row["on_ms"] <= row["off_ms"] * (1 - MARGIN)), row
        # the step the model was adopted in ran as written; then the trial's: on, off (untimed: first calls),
        # on/off mirrored; afterwards as decided
        assert seen[:3 + len(ORDER)] == [False, True, False, *ORDER], seen
        assert set(seen[3 + len(ORDER):]) == {row["kept"]}, seen
        notes = [str(w.message) for w in caught if issubclass(w.category, OptimizeWarning)]
        if row["kept"]:
            assert notes == []
        else:
            (note,) = notes
            assert f"autocast('cpu', bfloat16) measured {row['speedup']:.2f}x" in note and "turned off" in note
            assert caught[0].filename == __file__  # at the program's line, not the adapter's
    finally:
        torch_adapter.uninstall()


def test_the_decision_belongs_to_the_model_across_sessions():
    with forced("avx512_bf16"):
        with torch_adapter.adapted(target="cpu", optimization_level="balanced"):
            model = _model()
            _train(model, 12)
            (first,) = _trial_rows()
    with forced("avx512_bf16"):
        with torch_adapter.adapted(target="cpu", optimization_level="balanced"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                seen = _train(model, 3)
    assert seen[0] is False and set(seen[1:]) == {first["kept"]}  # adopted as written, then the decision stands
    assert not [w for w in caught if issubclass(w.category, OptimizeWarning)]


def test_what_is_put_on_trial_per_kind_and_option(monkeypatch):
    def parts(kind: str, **options) -> tuple[str, ...]:
        with forced(kind):
            session = torch_adapter.install(target="cpu", **options)
            try:
                return optimizing.plan_for(session)["trial"]
            finally:
                torch_adapter.uninstall()

    assert parts("avx2", optimization_level="balanced") == ()  # bf16 is emulated: never tried (0.29x measured)
    assert parts("avx2", optimization_level="aggressive") == ("compile",)
    assert parts("amx", optimization_level="aggressive") == ("compile", "autocast")
    assert parts("avx512_bf16", optimization_level="conservative") == ()
    assert parts("amx", optimization_level="balanced", mixed_precision="bf16") == ()  # the user's choice stands
    monkeypatch.setenv(ENV, "0")
    assert parts("amx", optimization_level="aggressive") == ()
    monkeypatch.delenv(ENV)
    session = torch_adapter.install(target="mps", simulate=True, optimization_level="aggressive")
    try:
        assert optimizing.plan_for(session)["trial"] == ()  # a preview: the real target's speed is not here
    finally:
        torch_adapter.uninstall()


def test_inference_is_timed_per_call_of_the_model():
    with forced("avx512_bf16"):
        torch_adapter.install(target="cpu", optimization_level="balanced")
    try:
        model, x = _model(), torch.randn(128, 256, device="cuda")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            for _ in range(4 + len(ORDER)):  # adopted in the 1st call, the trial from the 2nd's end
                out = model(x)
        assert out.dtype == torch.float32  # the program sees the dtype it was written for
        layer = optimizing._layer(torch_adapter.session.current(), create=False)
        assert layer.trial.done and set(layer.trial.decided) == {"autocast"}
    finally:
        torch_adapter.uninstall()


class _Optimizer:  # only its identity matters to the trial
    pass


@pytest.mark.parametrize(("on_s", "off_s", "kept"), [(0.09, 0.10, True), (0.099, 0.10, False), (0.12, 0.10, False)])
def test_the_rule_keeps_a_part_only_with_the_margin(on_s, off_s, kept):
    trial = Trial(["compile", "autocast"], level="aggressive", device="cpu", dtype="bfloat16", kind="amx")
    opt, other, now = _Optimizer(), _Optimizer(), 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trial.step_boundary(opt, now)  # the end of the first iteration (its start was not seen)
        while not trial.done:
            part, on, _ = trial._running
            now += (on_s if on else off_s) if part == "compile" else 0.1
            trial.step_boundary(other, now + 0.5)  # a second optimizer's step: not an iteration boundary
            trial.step_boundary(opt, now)
    assert trial.decided["compile"]["kept"] is kept and trial.state["compile"] is kept
    assert trial.decided["compile"]["on_ms"] == pytest.approx(on_s * 1e3)
    assert trial.decided["autocast"]["kept"] is False  # equal times: no gain, off
    assert trial.steps() == 2 * (2 + len(ORDER)) + 1
    notes = [str(w.message) for w in caught]
    assert len(notes) == (1 if kept else 2) and all("turned off" in n for n in notes)
