"""The adapter's own tensor work runs on one thread: :func:`one_thread`.

Torch's CPU kernels run their parallel regions on OpenMP's thread team, which the first region run with
more than one thread starts in the process. GNU libgomp (torch's CPU builds) is not fork-safe: a process
forked after that inherits a team whose threads do not exist, and hangs in its first parallel region.
Measured: in a notebook kernel whose first ``%load_ext torch_adapter`` ran the speed check
(``core/cpu_speed.py``: 512² matmuls) on the kernel's two threads, ``accelerate.notebook_launcher``'s
forked ranks hung in ``log_softmax`` for good. A program that never ran a parallel region itself forks
safely under plain torch, so the adapter must not start the team behind its back: what it computes for
itself at start-up or on a first decision (the speed check, the self-decomposition probe) runs with
torch's intra-op threads at one, and the program's count is put back after.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["one_thread"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op thread count at 1 for the block (the program's count restored after).

    Process-wide, as torch's setting is: only for the adapter's own short, rare work, never per op."""
    import torch

    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
