"""What each ``optimization_level`` means: one table, read by the optimization layer (the
script's models, optimizers and DDP wrappers, adopted as they run: :mod:`.layer`) and by
``torch_adapter.prepare(model)`` (one model, now: :mod:`.prepare`), so that a level means the
same thing wherever it is named.

=================  ==========================================================================
level              what it does
=================  ==========================================================================
``conservative``   nothing: eager, as written
``balanced``       optimizers run their fused (else foreach) kernels; convolution models go
                   channels-last where the target's convolutions prefer it; models run under
                   autocast in the target's fast low precision where it has one
``aggressive``     balanced, and each model is ``torch.compile``\\ d (inductor, its default mode)
=================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Level", "LEVELS", "level", "OptimizeWarning"]


class OptimizeWarning(UserWarning):
    """The optimization layer could not apply an option to an object, or a note on its cost."""


@dataclass(frozen=True)
class Level:
    name: str
    fast_optimizers: bool  # fused (else foreach) optimizer kernels
    channels_last: bool  # convolution models channels-last where the target's convolutions prefer it
    autocast: bool  # models under autocast in the target's fast low precision (where it has one)
    compile: bool  # torch.compile each model (default mode: the one measured, benchmarks/bench_optimize.py)


LEVELS = {
    "conservative": Level("conservative", False, False, False, False),
    "balanced": Level("balanced", True, True, True, False),
    "aggressive": Level("aggressive", True, True, True, True),
}


def level(name: str) -> Level:
    """The level called ``name`` (validated by the caller: config checks it before anything runs)."""
    return LEVELS[name]
