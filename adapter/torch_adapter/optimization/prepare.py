"""``torch_adapter.prepare(model)``: apply the session's ``optimization_level`` and
``memory_strategy`` to a model.

A level means what :mod:`.levels` says, here and in the optimization layer alike;
``prepare(model)`` applies the part that belongs to the model itself now, the layer the rest
(optimizer kernels, channels-last, autocast) when the model runs in the session:

=====================  ===============================================================
``optimization_level``  what ``prepare(model)`` returns
=====================  ===============================================================
``"conservative"``     the model itself, eager (the default: nothing changes)
``"balanced"``         the model itself (the layer applies the rest as it runs)
``"aggressive"``       ``torch.compile(model)`` (inductor, default mode)
=====================  ===============================================================

``memory_strategy="low"`` (or ``"aggressive"``) turns on the model's own gradient checkpointing
(diffusers ``enable_gradient_checkpointing()``, transformers
``gradient_checkpointing_enable()``): activations are recomputed in backward instead of
kept, trading compute for memory. A model without such a switch is left as it is, with a
:class:`PrepareWarning`. ``"default"`` changes nothing.

Compiling happens at the first call (``torch.compile`` is lazy); on a CPU, the first
compile of a tiny SD UNet step took ~110 s cold and 7–9 s with a warm cache, for a 1.06–1.11×
faster step (benchmarks/bench_compile.py). Compiled regions run inductor's generated
kernels, not aten ops one by one: on a *simulated* target the routing engine does not see
them, so the routing picture covers only the eager parts (a PrepareWarning says so).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError, format_error

__all__ = ["prepare", "plan", "Plan", "PrepareWarning"]


class PrepareWarning(UserWarning):
    """prepare() could not apply part of the plan, or what it applied hides routing."""


@dataclass(frozen=True)
class Plan:
    """What :func:`prepare` does for a given ``optimization_level`` and ``memory_strategy``."""

    optimization_level: str
    memory_strategy: str
    compile: bool
    gradient_checkpointing: bool

    def describe(self) -> str:
        steps = []
        if self.gradient_checkpointing:
            steps.append("turn on gradient checkpointing")
        steps.append("torch.compile(model)" if self.compile else "keep the model eager")
        return "; ".join(steps)


def plan(optimization_level: str | None = None, memory_strategy: str | None = None) -> Plan:
    """The :class:`Plan` for these options; None takes the installed session's (or the defaults)."""
    from ..core.state import current
    from ..core.config import MEMORY_STRATEGIES, OPTIMIZATION_LEVELS, Config
    from .levels import level as level_of

    session = current()
    cfg = session.config if session is not None else Config()
    level = cfg.optimization_level if optimization_level is None else optimization_level
    memory = cfg.memory_strategy if memory_strategy is None else memory_strategy
    if level not in OPTIMIZATION_LEVELS:
        raise UsageError(format_error("torch_adapter.prepare(optimization_level=...)",
                                      f"one of {', '.join(map(repr, OPTIMIZATION_LEVELS))}", repr(level),
                                      fix='e.g. prepare(model, optimization_level="balanced")'))
    if memory not in MEMORY_STRATEGIES:
        raise UsageError(format_error("torch_adapter.prepare(memory_strategy=...)",
                                      f"one of {', '.join(map(repr, MEMORY_STRATEGIES))}", repr(memory),
                                      fix='e.g. prepare(model, memory_strategy="low")'))
    return Plan(level, memory, level_of(level).compile, memory in ("low", "aggressive"))


def _checkpointing(model: Any) -> bool:
    """Turn on the model's gradient checkpointing; False when it has no switch for it."""
    for name in ("enable_gradient_checkpointing", "gradient_checkpointing_enable"):
        switch = getattr(model, name, None)
        if callable(switch):
            switch()
            return True
    return False


def prepare(model: Any, *, optimization_level: str | None = None, memory_strategy: str | None = None) -> Any:
    """Return ``model`` prepared as the session's options say (see the module doc).

    ``optimization_level`` / ``memory_strategy`` override the session's for this call.
    Conservative + default returns the very same object.
    """
    import torch

    p = plan(optimization_level, memory_strategy)
    if not callable(model):
        raise UsageError(format_error("torch_adapter.prepare(model)", "an nn.Module or a function",
                                      f"{model!r} ({type(model).__name__})", fix="prepare(my_model)"))
    if p.gradient_checkpointing and not _checkpointing(model):
        warnings.warn(f"torch_adapter.prepare(): {type(model).__name__} has no gradient-checkpointing switch "
                      f"(enable_gradient_checkpointing / gradient_checkpointing_enable), so memory_strategy='low' "
                      f"changes nothing for it; wrap its blocks with torch.utils.checkpoint.checkpoint instead",
                      PrepareWarning, stacklevel=2)
    if not p.compile:
        return model
    from ..core.state import current

    session = current()
    if session is not None and session.target.simulated:
        warnings.warn(f"torch_adapter.prepare(): compiled code runs inductor's kernels, so the simulated "
                      f"{session.target.name} routes are not applied inside it; use "
                      f"optimization_level='conservative' to preview routing", PrepareWarning, stacklevel=2)
    return torch.compile(model)
