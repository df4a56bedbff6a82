"""The low-precision kernels' recent outputs in their compute dtype, so a chain of rewritten ops
casts each activation once (routing/low_precision.py; docs/redirect.md "Low precision").

A rewritten call computes in bfloat16 (or float32) and hands the program a float16 tensor ``y16``
made from its result ``c``. When the next rewritten call takes ``y16`` — or a view of it: the
``query.view(B, L, H, D).transpose(1, 2)`` of a Linear output entering attention, a GroupNorm
output entering a 1x1 projection — casting ``y16`` back costs two passes over memory
(float16→float32→bfloat16) and gives ``c`` again: every bfloat16 value in float16's range is a
float16 value, so ``bf16(y16) == c`` bit for bit there. This cache hands out ``c`` (the same view
of it) instead.

Kept exact where it matters: an entry is keyed by the float16 tensor's identity (views reach it
through ``._base``, which shares its version counter), dropped when that tensor is changed in
place (its ``_version``) or freed (a weak reference), and used only when ``c`` has ``y16``'s
geometry. Differences from casting ``y16`` again: a value float16 overflowed to ``inf`` (or
flushed below its subnormals) stays the finite bfloat16/float32 value inside the chain (the
program's own ``y16`` still holds float16's answer); a float32 ``c`` (a float32-computed op) gives
``bf16(c)`` where recasting gives ``bf16(fp16(c))`` (one rounding instead of two). Bounded:
:data:`SIZE` most recent outputs (a chain's consumer comes within a few ops), so in training, where
autograd keeps activations until backward, the extra memory is a few activations, not a copy of
all of them.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["OutputCache", "SIZE"]

SIZE = 16


class OutputCache:
    """id(float16 output) -> (weak reference, version, the compute-dtype tensor it was made from)."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[int, tuple[Any, int, torch.Tensor]] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = 0

    def put(self, y16: torch.Tensor, c: torch.Tensor) -> None:
        if c.stride() != y16.stride() or c.storage_offset() or y16.storage_offset() or y16._base is not None \
                or y16.is_inference():  # an inference tensor has no version counter: a change could not be seen
            return
        key = id(y16)
        ref = weakref.ref(y16, lambda _r, k=key, e=self.entries: e.pop(k, None))
        with self.lock:
            self.entries[key] = (ref, y16._version, c)
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)

    def get(self, a: torch.Tensor, base: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """``a`` (float16; ``base`` is ``a`` or its ``_base``) in ``dtype``, from the compute-dtype
        tensor ``base`` was made from; None when there is none or it is stale."""
        entry = self.entries.get(id(base))
        if entry is None or entry[0]() is not base or base.is_inference() or entry[1] != base._version:
            return None
        c = entry[2]
        if a is not base:
            c = c.as_strided(a.shape, a.stride(), a.storage_offset())
        self.hits += 1
        if c.dtype is dtype:
            return c
        return c.to(dtype)  # bfloat16 -> float32 exact; float32 -> bfloat16 one rounding

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
