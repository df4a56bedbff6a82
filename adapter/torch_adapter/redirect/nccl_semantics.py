"""Collectives as nccl runs them, on the gloo groups the adapter chose in nccl's place.

A program written for nccl relies on what nccl takes and gloo refuses or computes otherwise. On the
groups the adapter made gloo (``groups.ours``: the default group of ``init_process_group("nccl")``,
``new_group(backend="nccl")``, subgroups made with no backend — redirect/distributed.py's ``_Groups``),
each collective below gets nccl's semantics; a gloo group the program asked for itself keeps gloo's.
Measured on torch 2.13's gloo, two ranks, every collective × op × {sync, ``wait()``, ``get_future()``,
a ``.then`` chain, a future asked for late, ``is_completed()`` polled} (tests/test_nccl_semantics.py):

- ``all_gather_into_tensor`` into a flat output (accelerate's ``gather``): gloo wants the pieces
  concatenated along dim 0; an input that requires grad made gloo fail;
- ``reduce_scatter_tensor`` from a (world, n) stack: gloo checked ``outputShape[0] * worldSize ==
  inputShape[0]``;
- ``reduce_scatter_tensor`` / ``reduce_scatter`` with ``async_op=True``: gloo's work has no future
  ("Work::getFuture not implemented") — an optimizer that overlaps its communication chains on it —
  and its ``is_completed()`` stays False until someone waits (a polling loop spins for good);
- ``ReduceOp.AVG`` on integer tensors: gloo divides in floating point and fails ("result type Float
  can't be cast to the desired output type Long"); nccl sums and divides in the integer type
  (truncating), so does the adapter;
- ``ReduceOp.PREMUL_SUM(factor)`` (nccl-only; FSDP2's ``set_gradient_divide_factor``) in
  ``all_reduce``, ``reduce``, ``reduce_scatter_tensor`` and ``reduce_scatter``: "Cannot use
  ReduceOp.PREMUL_SUM with Gloo" — a SUM of the inputs multiplied by the factor first, which is what
  nccl computes.

Where a step must follow the collective (the integer division, a copy back), a synchronous call does
it before returning, and an asynchronous one returns an :class:`NcclWork`: its ``wait()`` and its
future (``get_future()``, valued ``[tensor]`` as nccl's) complete only after the step.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

from ..core.patching import bindings

__all__ = ["NcclWork", "patch_gather_into_tensor", "patch_reductions"]


# torch imports torch.distributed itself; a build without it has no collectives to wrap
_Work: Any = torch.distributed.Work if torch.distributed.is_available() else object


class NcclWork(_Work):
    """The work of an asynchronous collective that needs a step after gloo's part (``finish``), or a
    future gloo's work lacks. ``wait()`` waits for gloo's work, then runs ``finish`` (once);
    ``get_future()`` is completed with ``result`` (nccl's value: the list of output tensors) after it."""

    def __init__(self, inner: Any, result: list[torch.Tensor], finish: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._inner, self._result, self._finish = inner, result, finish
        # two locks: a future asked for after gloo's work completed runs its callback (``_complete``)
        # inline, in the thread that asks — inside ``get_future`` — so the two must not share one
        # (one lock deadlocked a rank on a loaded machine: tests/test_nccl_semantics.py, form "late")
        self._finish_lock, self._future_lock = threading.Lock(), threading.Lock()
        self._finished = False
        self._future: Any = None

    def _complete(self) -> list[torch.Tensor]:
        with self._finish_lock:
            if not self._finished:
                self._finished = True
                if self._finish is not None:
                    self._finish()
        return self._result

    def wait(self, timeout: Any = None) -> bool:
        if timeout is None:
            self._inner.wait()
        else:
            self._inner.wait(timeout)
        self._complete()
        return True

    def get_future(self) -> Any:
        with self._future_lock:
            if self._future is None:
                try:
                    inner = self._inner.get_future()
                except RuntimeError:  # gloo's reduce_scatter: "Work::getFuture not implemented."
                    inner = None
                if inner is not None:
                    self._future = inner.then(lambda fut: (fut.value(), self._complete())[1])
                else:
                    self._future = self._waited()
            return self._future

    def _waited(self) -> Any:
        """A future completed by a thread that waits for gloo's work: the only way to learn that a work
        without a future is done — gloo's reduce_scatter work also answers ``is_completed()`` False until
        someone waits (measured on torch 2.13), where nccl's turns True by itself."""
        future: Any = torch.futures.Future()

        def complete() -> None:
            try:
                self.wait()
            except Exception as exc:  # the collective's own error reaches whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(self._result)

        threading.Thread(target=complete, name="torch_adapter: collective future", daemon=True).start()
        return future

    def is_completed(self) -> bool:
        """True once gloo's part is done and the step after it ran — a program that polls instead of
        waiting (``while not work.is_completed()``) runs the step here, as nccl's work is complete then."""
        if self._finished:
            return True
        if self._inner.is_completed():
            if self._inner.is_success():
                self._complete()
            return True
        return self.get_future().done()  # for a work without a future of its own, the waiting thread's

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self) -> Any:
        return self._inner.exception()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        return f"<torch_adapter NcclWork over {self._inner!r}>"


def _done(work: Any, async_op: bool, result: list[torch.Tensor], finish: Callable[[], None] | None,
          needs_future: bool = False) -> Any:
    """What the program gets back: None after ``finish`` (sync), or nccl's Work (async)."""
    if not async_op:
        if finish is not None:
            finish()
        return work
    if finish is None and not needs_future:
        return work
    return NcclWork(work, result, finish)


def _premul_factor(op: Any) -> Any:
    """The factor of a ``ReduceOp.PREMUL_SUM(factor)`` (``_make_nccl_premul_sum``), else None."""
    import torch.distributed as dist

    if getattr(op, "op", None) == dist.ReduceOp.RedOpType.PREMUL_SUM:
        return getattr(op, "factor", None)
    return None


def _is_avg(op: Any) -> bool:
    import torch.distributed as dist

    return op == dist.ReduceOp.AVG or getattr(op, "op", None) == dist.ReduceOp.RedOpType.AVG


def _nccl_only(op: Any) -> bool:
    """Is ``op`` one gloo may refuse or compute otherwise (PREMUL_SUM; AVG, on integer tensors)?"""
    return _is_avg(op) or _premul_factor(op) is not None


def _integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype is torch.bool)


def _scaled(t: torch.Tensor, factor: Any) -> torch.Tensor:
    """``t * factor`` (a PREMUL_SUM's input; the factor a number or a one-element tensor)."""
    with torch.no_grad():
        return t * (factor.to(t.device) if isinstance(factor, torch.Tensor) else factor)


def _divider(tensors: list[torch.Tensor], group: Any) -> Callable[[], None]:
    """nccl's integer AVG after a SUM: divide in the tensors' own type, truncating."""
    import torch.distributed as dist

    world = dist.get_world_size(group)

    def divide() -> None:
        with torch.no_grad():
            for t in tensors:
                t.div_(world, rounding_mode="trunc")

    return divide


def _reduction(op: Any, tensors: list[torch.Tensor], group: Any) -> tuple[Any, Callable[[], None] | None]:
    """(the op gloo is given, the step after it) for an op gloo refuses or computes otherwise."""
    import torch.distributed as dist

    if _is_avg(op) and tensors and all(_integer(t) for t in tensors):
        return dist.ReduceOp.SUM, _divider(tensors, group)
    return op, None


def _is_dst(group: Any, dst: Any, group_dst: Any) -> bool:
    import torch.distributed as dist

    if group_dst is not None:
        return dist.get_rank(group) == group_dst
    return dist.get_rank() == (0 if dst is None else dst)


def patch_reductions(session: Any, groups: Any) -> None:
    """``all_reduce``, ``reduce``, ``reduce_scatter_tensor`` / ``reduce_scatter_single`` and
    ``reduce_scatter`` with nccl's semantics on the adapter's gloo groups (module docstring)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    SUM = dist.ReduceOp.SUM

    def install(orig: Any, new: Callable) -> None:
        wrapped = functools.wraps(orig)(new)
        for owner, name, _ in bindings(orig, within="torch.distributed"):
            session.patcher.set(owner, name, wrapped)

    orig_ar = c10d.all_reduce

    def all_reduce(tensor: Any, op: Any = SUM, group: Any = None, async_op: bool = False) -> Any:
        if not _nccl_only(op) or not isinstance(tensor, torch.Tensor) or not groups.ours(group):
            return orig_ar(tensor, op, group, async_op)
        factor = _premul_factor(op)
        if factor is not None:
            with torch.no_grad():
                tensor.mul_(factor)  # reduced in place anyway
            op = SUM
        op, finish = _reduction(op, [tensor], group)
        return _done(orig_ar(tensor, op, group, async_op), async_op, [tensor], finish)

    install(orig_ar, all_reduce)

    orig_reduce = c10d.reduce

    def reduce(tensor: Any, dst: Any = None, op: Any = SUM, group: Any = None, async_op: bool = False,
               group_dst: Any = None) -> Any:
        if not _nccl_only(op) or not isinstance(tensor, torch.Tensor) or not groups.ours(group):
            return orig_reduce(tensor, dst, op, group, async_op, group_dst)
        factor = _premul_factor(op)
        sent = tensor
        if factor is not None:  # a scaled copy: a rank other than dst keeps its tensor, as nccl leaves it
            sent, op = _scaled(tensor, factor), SUM
        op, divide = _reduction(op, [sent], group)
        finish = None
        if _is_dst(group, dst, group_dst) and (divide is not None or sent is not tensor):
            def finish() -> None:
                if divide is not None:
                    divide()
                if sent is not tensor:
                    with torch.no_grad():
                        tensor.copy_(sent)
        return _done(orig_reduce(sent, dst, op, group, async_op, group_dst), async_op, [tensor], finish)

    install(orig_reduce, reduce)

    orig_rs = getattr(c10d, "reduce_scatter_single", None) or c10d.reduce_scatter_tensor

    def reduce_scatter_single(output: Any, input: Any, op: Any = SUM, group: Any = None,
                              async_op: bool = False) -> Any:
        if not (isinstance(input, torch.Tensor) and isinstance(output, torch.Tensor) and groups.ours(group)):
            return orig_rs(output, input, op, group, async_op)
        input = _concatenated(input, output, group, groups)
        factor = _premul_factor(op)
        if factor is not None:
            input, op = _scaled(input, factor), SUM
        op, finish = _reduction(op, [output], group)
        return _done(orig_rs(output, input, op, group, async_op), async_op, [output], finish, needs_future=True)

    install(orig_rs, reduce_scatter_single)

    orig_rsl = c10d.reduce_scatter

    def reduce_scatter(output: Any, input_list: Any, op: Any = SUM, group: Any = None,
                       async_op: bool = False) -> Any:
        if not (isinstance(output, torch.Tensor) and isinstance(input_list, (list, tuple)) and groups.ours(group)):
            return orig_rsl(output, input_list, op, group, async_op)
        factor = _premul_factor(op)
        if factor is not None:
            input_list, op = [_scaled(t, factor) for t in input_list], SUM
        op, finish = _reduction(op, [output], group)
        return _done(orig_rsl(output, input_list, op, group, async_op), async_op, [output], finish,
                     needs_future=True)

    install(orig_rsl, reduce_scatter)


def patch_gather_into_tensor(session: Any, groups: Any) -> None:
    """``all_gather_into_tensor`` (``all_gather_single``; accelerate's ``gather``) as nccl runs it, on gloo.

    - An input that requires grad: gloo fails ("A view was created in no_grad mode…") where nccl does
      not. c10d collectives record no autograd either way, so the input is passed detached (same storage).
    - The output's shape: nccl takes any output holding world_size × the input's elements, and
      accelerate's ``gather`` passes a flat one (``torch.empty(world * t.numel())``, viewed back as
      ``(-1, *t.shape[1:])`` after). gloo splits the output along dim 0 and wants each piece shaped as the
      input: a (B, C) input (logits, ``gather_for_metrics``) failed with "invalid tensor size at index
      0 (expected (1, 16), got (16))". On the groups the adapter made gloo in place of nccl, a contiguous
      output with the right number of elements is handed to gloo viewed as the inputs concatenated along
      dim 0 — the same memory, so the caller's tensor holds the result.
    """
    from torch.distributed import distributed_c10d as c10d

    orig = getattr(c10d, "all_gather_single", None)
    if orig is None:
        return

    @functools.wraps(orig)
    def all_gather_single(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        if isinstance(input_tensor, torch.Tensor):
            if input_tensor.requires_grad:
                input_tensor = input_tensor.detach()
            if isinstance(output_tensor, torch.Tensor):
                output_tensor = _concatenated(output_tensor, input_tensor, group, groups)
        return orig(output_tensor, input_tensor, group, async_op)

    for owner, name, _ in bindings(orig, within="torch.distributed"):  # _functional_collectives: legacy_allgather_single
        session.patcher.set(owner, name, all_gather_single)


def _concatenated(big: torch.Tensor, piece: torch.Tensor, group: Any, groups: Any) -> torch.Tensor:
    """``big`` (world_size × ``piece``'s elements) viewed as gloo wants it — pieces shaped as ``piece``,
    concatenated along dim 0 — where nccl would take it as it is (any shape with those elements)."""
    import torch.distributed as dist

    shape = tuple(piece.shape)
    if big.dim() == piece.dim() and tuple(big.shape[1:]) == shape[1:]:
        return big  # already the concatenated layout (or a mismatch gloo should report itself)
    if not groups.ours(group) or not big.is_contiguous():
        return big
    world = dist.get_world_size(group)
    if big.numel() != world * piece.numel():
        return big
    return big.view((world * shape[0], *shape[1:]) if shape else (world,))
