"""CUDA graphs on a target without them: capture records the aten ops, replay re-runs them.

A CUDA graph keeps every tensor of the capture at a fixed address: the program fills its
static inputs with ``copy_``, calls ``replay()`` and reads its static outputs. The emulation
keeps those semantics (docs/cuda-namespace.md, "CUDA graphs"):

- **capture** (``capture_begin`` .. ``capture_end``, ``with torch.cuda.graph(g)``) pushes a
  TorchDispatchMode on the capturing thread that runs each aten op and records it (the op,
  its arguments by tensor identity, its outputs). An op is kept when it writes to an argument
  (its schema's ``Tensor(a!)``) or returns a tensor with its own storage; views of recorded
  tensors need no replay (they share the storage). The tensors that existed before the
  capture and that the capture wrote to (parameters, optimizer state, running stats) get
  their contents back at ``capture_end``: CUDA does not run captured work, so the first
  replay is the first step, as on CUDA.
- **replay** re-runs the kept ops in order, below autograd and autocast (the recorded ops are
  already the casts autocast chose), on the *same* tensor objects: in-place ops write their
  arguments again, fresh results are copied into the tensors recorded at capture, so static
  outputs, ``.grad`` tensors made in the capture and optimizer state all update in place.
  Random ops draw new numbers on every replay (CUDA graphs advance the Philox offset).
- a capture that a CUDA graph cannot hold either (a host synchronisation: ``.item()``,
  ``.cpu()``, ``.tolist()``, printing, ``torch.cuda.synchronize()``; an op whose output shape
  depends on the data: ``nonzero``) raises :class:`GraphCaptureError`, a
  ``torch.AcceleratorError`` as CUDA's "operation not permitted when stream is capturing".

Each capture and each replay is a row of the redirect log (kind ``graph``) at the user's line.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


import torch
from torch.utils import _pytree as pytree

from ..core import torch_private as _tp
from ..core.patching import bindings, mark_stand_in, original_of
from ..errors import AdapterError, UnsupportedCudaFeature, format_error

DOC_MARKDOWN = """
## CUDA graphs

On a target without CUDA graphs, `torch.cuda.CUDAGraph`, `torch.cuda.graph(g, pool=, stream=,
capture_error_mode=)`, `g.replay()`, `g.reset()`, `g.pool()`, `torch.cuda.graph_pool_handle()` and
`torch.cuda.make_graphed_callables` (torch's own function, building its graphs from the two
above) keep CUDA's static-buffer semantics by emulation (`redirect/cuda_graphs.py`):

- **capture** runs each aten op on the capturing thread under a TorchDispatchMode and records it
  with its tensors by identity. Ops that write to an argument or return a tensor with its own
  storage are kept; views share their base's storage and need no replay. Tensors that existed
  before the capture and that it wrote to (parameters, optimizer state, running statistics) get
  their contents back at the capture's end: CUDA does not run captured work, so the first
  `replay()` is the first step, as on CUDA.
- **replay** re-runs the kept ops in order, below autograd and autocast, on the same tensor
  objects: in-place ops write their arguments again, fresh results are copied into the tensors
  of the capture. Static outputs, `.grad` tensors made in the capture and optimizer state update
  in place, so the classic pattern (fill the static input with `copy_`, `replay()`, read the
  static output), whole-network capture (forward, backward and `optimizer.step()` in one graph)
  and `make_graphed_callables` train exactly as eager torch (tests/test_cuda_graphs.py compares
  bit for bit). Random ops draw new numbers on every replay, as CUDA graphs advance the Philox
  offset. Capturable optimizers (`Adam(capturable=True)` & co.) accept the target's device.
- **refused**, with `torch.AcceleratorError` (CUDA's class for "operation not permitted when
  stream is capturing"; the adapter's `GraphCaptureError` subclasses it) naming the call, the
  target and the fix: a host synchronisation inside the capture (`.item()`, `bool(t)`, `.cpu()`,
  `.tolist()`, `.numpy()`, printing a tensor, `torch.cuda.synchronize()`, `Stream/Event.synchronize()`)
  and ops whose output depends on the data (torch's `data_dependent_output` and
  `dynamic_output_shape` tags: `nonzero`, `unique`, `masked_select`, ...). The failed graph
  refuses `replay()`. `raw_cuda_graph()`/`raw_cuda_graph_exec()`/`get_graph_data()` raise
  `UnsupportedCudaFeature` (there are no CUDA handles).
- **reported**: each capture (ops recorded) and each replay is a row of the redirect log, kind
  `graph`, at the user's line (`torch-adapter run --report` prints it); the replayed ops are
  routed and counted like any other.
- **what it is not**: no launch overhead is saved (replay is a Python loop over the recorded
  ops, as fast as eager). Python side effects inside the capture run once, at capture, as on
  CUDA. Work on other threads is not captured (`capture_error_mode` is accepted and checked).
- **targets with their own graphs**: where `torch.<target>` has a graph class of CUDA's shape
  (`torch.xpu.XPUGraph`, torch_npu's `torch.npu.NPUGraph`, with `graph` and
  `graph_pool_handle`), the stand-in is that API and nothing is emulated. (`torch.accelerator.Graph`,
  new in torch 2.13, takes its pool at construction, not at `capture_begin`, so it is not a
  drop-in `CUDAGraph`.)
"""

__all__ = ["GraphCaptureError", "CUDAGraph", "graph", "graph_pool_handle", "capturing", "check_not_capturing"]


class GraphCaptureError(AdapterError, torch.AcceleratorError):
    """A captured region did something a CUDA graph cannot replay (CUDA raises
    ``torch.AcceleratorError`` "operation not permitted when stream is capturing")."""


_MODES = ("global", "thread_local", "relaxed")
_DATA_DEPENDENT = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}
_UNDEFINED = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
              "aten::new_empty_strided"}  # fresh memory whose contents a replay need not recompute
_SPELLED = {"aten::_local_scalar_dense": " (Tensor.item(), bool/int/float(tensor))"}
_tls = threading.local()


def capturing() -> "_Capture | None":
    """The capture under way on this thread, or None."""
    return getattr(_tls, "capture", None)


def check_not_capturing(call: str) -> None:
    """Raise :class:`GraphCaptureError` when ``call`` (a host synchronisation) runs inside a capture."""
    cap = capturing()
    if cap is not None:
        cap.fail(call, "it waits for the device (a host synchronisation)",
                 "move it before or after the capture, or guard it with torch.cuda.is_current_stream_capturing()")


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    fresh: list[tuple[int, torch.Tensor]]  # (index among the flat outputs, the tensor recorded)


@dataclass
class _Capture:
    """What one capture records, and the state it puts back at its end."""

    target: str
    ops: list[_Op] = field(default_factory=list)
    made: set[int] = field(default_factory=set)  # storages created inside the capture
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    failed: str | None = None

    def fail(self, call: str, why: str, fix: str) -> None:
        self.failed = call
        raise GraphCaptureError(format_error(
            call, "work a CUDA graph can replay", f"{call} inside a CUDA graph capture (emulated on {self.target})",
            why=f"operation not permitted when stream is capturing: {why}; CUDA refuses it too", fix=fix))

    def before(self, func: Any, args: tuple, kwargs: dict) -> None:
        if _DATA_DEPENDENT & set(func.tags):
            spelled = _SPELLED.get(func.name(), "")
            self.fail(f"{func.name()}{spelled}",
                      "its result (a Python value or an output shape) depends on the data, "
                      "which a graph fixes at capture",
                      "keep it outside the capture, or use a static-shape variant (nonzero_static, torch.where)")
        for t in _tp.mutated_tensors(func, args, kwargs):
            if _storage_key(t) not in self.made and id(t) not in self.saved:
                self.saved[id(t)] = (t, t.detach().clone())  # put back at capture_end

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        inputs = {_storage_key(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        fresh = []
        for i, o in enumerate(pytree.tree_leaves(out)):
            if isinstance(o, torch.Tensor) and _storage_key(o) not in inputs:
                fresh.append((i, o))
                self.made.add(_storage_key(o))
        if func.name() in _UNDEFINED and not _tp.mutated_tensors(func, args, kwargs):
            return
        if fresh or func._schema.is_mutable:
            self.ops.append(_Op(func, args, kwargs, fresh))

    def restore(self) -> None:
        with _tp.below_autograd_and_autocast(("cuda", self.target)):
            for t, before in reversed(list(self.saved.values())):
                t.copy_(before)
        self.saved.clear()


class _Recorder(_tp.dispatch_mode_base()):  # type: ignore[misc]
    def __init__(self, capture: _Capture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.capture.before(func, args, kwargs)
        out = func(*args, **kwargs)
        self.capture.record(func, args, kwargs, out)
        return out


_HOST_SYNC = {torch.Tensor.item: ".item()", torch.Tensor.tolist: ".tolist()", torch.Tensor.cpu: ".cpu()",
              torch.Tensor.numpy: ".numpy()", torch.Tensor.__repr__: "printing a tensor",
              torch.Tensor.__format__: "formatting a tensor", torch.Tensor.__array__: "numpy.asarray(tensor)"}


class _HostSyncGuard(_tp.function_mode_base()):  # type: ignore[misc]
    """Refuses what copies device data to the host inside a capture (CUDA refuses it too)."""

    def __init__(self, capture: _Capture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        what = _HOST_SYNC.get(func)
        if what is not None:
            self.capture.fail(f"Tensor{what}" if what.startswith(".") else what,
                              "it copies device data to the host (a synchronisation)",
                              "read the result after replay() (a static output), or move it out of the capture")
        return func(*args, **(kwargs or {}))


def _check_mode(mode: str, call: str) -> None:
    if mode not in _MODES:
        raise RuntimeError(format_error(call, f"capture_error_mode one of {', '.join(_MODES)}", repr(mode),
                                        fix="capture_error_mode='global' (the default)"))


_pool_ids = iter(range(1, 1 << 62))


def graph_pool_handle() -> tuple[int, int]:
    """An opaque memory-pool token (the emulation keeps each graph's tensors; pools are only names)."""
    return (0, next(_pool_ids))


def _log(kind_asked: str, became: str) -> None:
    from ..core.state import current

    session = current()
    if session is not None:
        session.redirect_log.record("graph", kind_asked, became, depth=4)


class CUDAGraph:
    """``torch.cuda.CUDAGraph`` emulated on the target (torch_adapter): capture records the aten
    ops run on the capturing thread, ``replay()`` re-runs them on the same tensors."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.keep_graph = keep_graph
        self._capture: _Capture | None = None
        self._modes: tuple[Any, Any] | None = None
        self._pool = graph_pool_handle()
        self._debug = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        _check_mode(capture_error_mode, "torch.cuda.CUDAGraph.capture_begin()")
        if capturing() is not None:
            raise GraphCaptureError(format_error(
                "torch.cuda.CUDAGraph.capture_begin()", "one capture at a time on a thread",
                "a capture already under way", fix="end the other capture (capture_end) first"))
        from ..core.state import current

        session = current()
        target = session.target.device_type if session is not None else "cpu"
        if pool is not None:
            self._pool = pool
        self._capture = _Capture(target)
        self._modes = (_HostSyncGuard(self._capture), _Recorder(self._capture))
        _tls.capture = self._capture
        for mode in self._modes:
            mode.__enter__()

    def capture_end(self) -> None:
        cap, modes = self._capture, self._modes
        if cap is None or modes is None:
            raise RuntimeError(format_error("torch.cuda.CUDAGraph.capture_end()", "a capture under way",
                                            "no capture", fix="call capture_begin() first"))
        self._modes = None
        _tls.capture = None
        if not _tp.remove_dispatch_mode(modes[1]):
            modes[1].__exit__(None, None, None)
        modes[0].__exit__(None, None, None)
        cap.restore()
        if cap.failed:
            _log("torch.cuda.graph capture", f"emulation refused on {cap.target}: {cap.failed}")
            return
        _log("torch.cuda.graph capture", f"emulated on {cap.target}: {len(cap.ops)} ops recorded, "
             "replay() re-runs them on the same tensors")

    def instantiate(self) -> None:
        return None

    def replay(self) -> None:
        cap = self._capture
        if cap is None or self._modes is not None or cap.failed:
            raise RuntimeError(format_error(
                "torch.cuda.CUDAGraph.replay()", "a completed capture",
                "a capture that failed" if cap is not None and cap.failed else "no completed capture",
                fix="capture the graph (with torch.cuda.graph(g): ...) before replay()"))
        with _tp.below_autograd_and_autocast(("cuda", cap.target)):
            for op in cap.ops:
                res = op.func(*op.args, **op.kwargs)
                if op.fresh:
                    flat = pytree.tree_leaves(res)
                    for i, dst in op.fresh:
                        dst.copy_(flat[i])
        _log("torch.cuda.CUDAGraph.replay()", f"emulated: {len(cap.ops)} recorded ops re-run on {cap.target}")

    def reset(self) -> None:
        if self._modes is not None:
            self.capture_end()
        self._capture = None

    def pool(self) -> Any:
        return self._pool

    def enable_debug_mode(self) -> None:
        self._debug = True

    def debug_dump(self, debug_path: str) -> None:
        cap = self._capture
        with open(debug_path, "w", encoding="utf-8") as f:
            f.write("".join(f"{op.func.name()}\n" for op in (cap.ops if cap else [])))

    def _raw(self, what: str) -> Any:
        raise UnsupportedCudaFeature(format_error(
            f"torch.cuda.CUDAGraph.{what}()", "a CUDA graph handle", "an emulated graph (torch_adapter target)",
            why="the emulation records aten ops, not CUDA kernels", fix="guard this call with torch.version.cuda"))

    def raw_cuda_graph(self) -> int:
        return self._raw("raw_cuda_graph")

    def raw_cuda_graph_exec(self) -> int:
        return self._raw("raw_cuda_graph_exec")

    def get_graph_data(self) -> dict:
        return self._raw("get_graph_data")


class graph:  # noqa: N801 - torch's spelling
    """``torch.cuda.graph``: captures into an emulated :class:`CUDAGraph` (torch_adapter)."""

    default_capture_stream: Any = None

    def __init__(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", enable_annotations: bool = False,
                 check_input_liveness: bool = False) -> None:
        _check_mode(capture_error_mode, "torch.cuda.graph()")
        if not isinstance(cuda_graph, CUDAGraph):
            raise TypeError(format_error("torch.cuda.graph()", "a torch.cuda.CUDAGraph", type(cuda_graph).__name__,
                                         fix="g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): ..."))
        self.cuda_graph, self.pool, self.stream = cuda_graph, pool, stream
        self.capture_error_mode = capture_error_mode
        self.check_input_liveness = check_input_liveness

    def __enter__(self) -> None:
        self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, *exc: object) -> None:
        if self.cuda_graph._modes is not None:
            if exc[0] is not None and self.cuda_graph._capture is not None:
                self.cuda_graph._capture.failed = self.cuda_graph._capture.failed or exc[0].__name__
            self.cuda_graph.capture_end()


def _graphed_callables(original: Any) -> Any:
    """torch's own ``make_graphed_callables``: it builds its graphs with ``torch.cuda.CUDAGraph``
    and ``torch.cuda.graph``, which are the emulation's while installed."""

    def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                               allow_unused_input: bool = False, pool: Any = None) -> Any:
        _log("torch.cuda.make_graphed_callables", "emulated CUDA graphs (forward and backward captured)")
        return original(callables, sample_args, num_warmup_iters=num_warmup_iters,
                        allow_unused_input=allow_unused_input, pool=pool)

    original = original_of(original)  # nested sessions
    make_graphed_callables.__doc__ = original.__doc__
    return mark_stand_in(make_graphed_callables, original)


def names(dev_mod: Any) -> dict[str, Any]:
    """The graph names of the ``torch.cuda`` stand-in: the target's own graph API when
    ``torch.<target>`` has one (``torch.xpu.XPUGraph`` & co.), else the emulation."""
    if dev_mod is not None:
        own = getattr(dev_mod, f"{dev_mod.__name__.rpartition('.')[2].upper()}Graph", None)
        if isinstance(own, type) and all(hasattr(dev_mod, n) for n in ("graph", "graph_pool_handle")):
            ns = {"CUDAGraph": own, "graph": dev_mod.graph, "graph_pool_handle": dev_mod.graph_pool_handle}
            for n in ("make_graphed_callables", "is_current_stream_capturing"):
                if hasattr(dev_mod, n):
                    ns[n] = getattr(dev_mod, n)
            return ns
    original = vars(torch.cuda.graphs)["make_graphed_callables"]
    return {"CUDAGraph": CUDAGraph, "graph": graph, "graph_pool_handle": graph_pool_handle,
            "make_graphed_callables": _graphed_callables(original),
            "is_current_stream_capturing": lambda: capturing() is not None}


def capturable_optimizers(session: Any) -> None:
    """``capturable=True`` optimizers (Adam & co. keep ``step`` on the device so that a graph can
    replay ``optimizer.step()``) accept the target's device while the emulation stands in for
    CUDA graphs: torch's ``_get_capturable_supported_devices`` gains it, in every
    ``torch.optim`` module that bound the name."""
    import sys

    device_type = session.target.device_type
    base = vars(sys.modules["torch.optim.optimizer"])["_get_capturable_supported_devices"]
    base = original_of(base)

    # TorchScript code calls it too (torch.distributed.optim scripts the functional optimizers at
    # import): redirect/torchscript.py compiles torch's own function there, not this closure.
    def _get_capturable_supported_devices(supports_xla: bool = True) -> list[str]:
        devices = base(supports_xla)
        return devices if device_type in devices else [*devices, device_type]

    mark_stand_in(_get_capturable_supported_devices, base)
    for module, name, _ in bindings(base, within="torch.optim", name="_get_capturable_supported_devices"):
        session.patcher.set(module, name, _get_capturable_supported_devices)
