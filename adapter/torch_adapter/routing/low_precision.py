"""float16 at the speed of the CPU it runs on: the heavy float16 ops computed in the CPU's fast dtype.

A CUDA-written program takes its float16 path under the adapter (``torch.cuda.is_available()``
is True): float16 weights (``.half()``, ``.to(device, torch.float16)``, diffusers'
``torch_dtype=torch.float16``), ``autocast("cuda", float16)``. A CPU without fp16 units
*emulates* float16 matmuls and convolutions — ~40x slower than float32 on an AVX-512 EPYC
without avx512_fp16 — and even a CPU with avx512_fp16 runs them slower than its AMX bf16 tiles.

Mechanism: session-owned ``torch.library`` kernels on the CPU dispatch key for the float16
calls of the heavy ops (:data:`OPS`: the matmul family, convolution and the CPU attention
kernel, forward and backward). A float16 call casts its float16 inputs to the compute dtype
the policy chose (``bfloat16`` where the CPU has bf16 units, ``float32`` where it has neither,
``float16``: no kernel at all; :mod:`torch_adapter.core.cpu_features`), runs the CPU's own
kernel on them and casts the result back to float16. The kernels sit below autograd and
autocast, so ``tensor.dtype``, autograd's saved tensors, state dicts and saved files stay
float16; every other call (float32, bfloat16, integers) goes straight to the CPU's kernel.
:data:`FP32_OPS` (group_norm and its backward, softmax: float16 CPU kernels slower than float32 with
two casts) compute in float32 under any policy but the off switch; under ``auto``, so does attention's
forward (:data:`ATTENTION_OPS`) where the CPU's bfloat16 attention is slower than float32 (no AMX tiles:
:func:`attention_dtype`). A rewritten call's float16 output
keeps its compute-dtype original for the next rewritten call that takes it (:mod:`.lowp_cache`).

Policy: ``install(float16_compute=...)`` / ``configure`` / ``torch-adapter run --float16-compute``:
``"auto"`` (default: the CPU's choice), ``"bfloat16"``, ``"float32"``, ``"float16"`` (off:
float16 computed as float16, no kernel registered). Only the real CPU target (a simulated
target keeps the host's plain kernels, so its routing preview is undisturbed).

Visible: each rewritten call is a ``composite`` route in ``trace()``/``run --report`` with
``via="low_precision"`` and its reason (``float16 computed in bfloat16 (this CPU has ...)``);
the first rewrite of each op is one redirect-log row. docs/redirect.md "Low precision".
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ..core import torch_private as tp
from .lowp_cache import OutputCache

__all__ = ["OPS", "ATTENTION_OPS", "apply", "compute_dtype", "attention_dtype"]

# op -> the output positions that carry the activation dtype (cast back to float16); None: one output.
# Inputs that stay float32 whatever the activations' dtype (the attention kernel's logsumexp) are
# listed in _FP32_INPUTS.
OPS: dict[str, tuple[int, ...] | None] = {
    "aten::mm": None, "aten::addmm": None, "aten::bmm": None, "aten::baddbmm": None,
    "aten::convolution": None, "aten::convolution_backward": (0, 1, 2),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0,),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (0, 1, 2),
}
_FP32_INPUTS = {"aten::_scaled_dot_product_flash_attention_for_cpu_backward": 5}
# Ops whose float16 CPU kernels are slower than float32 ones with the two casts (CUDA autocast's fp32
# list has them too), computed in float32 with float16 in and out whatever the policy's dtype (bf16
# is slower than float32 there as well). Measured, 1 thread, a (2, 64, 32, 32) input, 32 groups:
# group_norm fp16 209-326 us, fp32 with casts 76-109 us (fp32 49-72 us) on AVX-512 and AVX2 alike;
# its backward fp16 553 vs fp32 256 us; softmax over (8, 1024, 16) fp16 843-1176 vs fp32 190-263 us
# on AVX-512 (AVX2: 256 vs 227). layer_norm, silu, add, gelu: fp16 within 1.3x of fp32, not worth
# two casts. The outputs come back in float16 (group_norm's mean/rstd too: the dtypes its CPU kernel
# gives, so autograd's saved tensors and the backward see what they see without the adapter).
FP32_OPS: dict[str, tuple[int, ...] | None] = {
    "aten::native_group_norm": (0, 1, 2), "aten::native_group_norm_backward": (0, 1, 2), "aten::_softmax": None,
}
OPS.update(FP32_OPS)
# Attention's forward kernel computes in float32 where the CPU's bfloat16 attention is slower than its
# float32 one although its bfloat16 products are faster (no AMX-BF16 tiles: core/cpu_features.py
# ATTENTION_WITHOUT_AMX; measured by core/cpu_speed.py where it can be). There its backward computes in
# bfloat16 only over at least _MANY_KEYS key tokens (benchmarks/bench_attention_dtype.py on an
# avx512_bf16 EPYC, 1 thread, bfloat16's time over float32's: 0.39-0.89x with 512-2,048 keys, 1.02-3.5x
# with 8-256 keys and 1.15x with 77 keys over 2,048-4,096 queries), float32 below.
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",)
ATTENTION_BACKWARD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
_MANY_KEYS = 512
# _softmax(half_to_float=True) asks for a float32 output, which the CPU refuses: the CPU's kernel answers
_UNCHANGED_IF_TRUE = {"aten::_softmax": 2}
_HALF = torch.float16
_PARAMETER = torch.nn.Parameter
_TensorBase = torch._C.TensorBase
# Below this many multiply-adds a bfloat16 product is slower than a float32 one (oneDNN's set-up
# dominates; measured here, 1 thread: a 16x64x128 mm 34 us bf16 vs 7 us fp32, 2048x64x64 106 vs
# 215 us; a 3x3 conv 8->16 channels at 8x8 126 vs 17 us, 32->32 at 16x16 133 vs 123 us, 64->64 at
# 32x32 462 vs 1149 us).
_SMALL_MACS = 1 << 20
_SMALL_CONV_MACS = 1 << 22


# op -> (size rule, the two factors' argument positions, the size under which a bfloat16 call computes in
# float32): 1 = a product of args[ia] (any shape) and args[ib] (its last dim: bmm's batch included);
# 2 = a convolution of input args[ia] by weight args[ib]; 3 = attention: the key tokens of args[ib] (the
# attention backward's rule where its forward is float32: _size_rule).
# One table for both rewrites: the Python kernel (_macs) and the C++ gate (_gate_spec).
_SIZE_RULES: dict[str, tuple[int, int, int, int]] = {
    "aten::mm": (1, 0, 1, _SMALL_MACS), "aten::bmm": (1, 0, 1, _SMALL_MACS), "aten::addmm": (1, 1, 2, _SMALL_MACS),
    "aten::baddbmm": (1, 1, 2, _SMALL_MACS), "aten::convolution": (2, 0, 1, _SMALL_CONV_MACS)}
_KEYS_RULE = (3, 1, 2, _MANY_KEYS)  # the attention backward's query (args[1]) and key (args[2])


def _size_rule(name: str, fp32_ops: frozenset[str]) -> tuple[int, int, int, int] | None:
    """``name``'s size rule under a float32 set: the static ones, and the attention backward's key count
    where the forward computes in float32 (no AMX tiles: its bfloat16 backward pays off over many keys only)."""
    if name == ATTENTION_BACKWARD:
        return _KEYS_RULE if ATTENTION_OPS[0] in fp32_ops else None
    return _SIZE_RULES.get(name)


def _macs(rule: tuple[int, int, int, int], args: tuple) -> int:
    kind, ia, ib, small = rule
    a, b = args[ia], args[ib]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return small  # not two tensors: never "small"
    if kind == 1:
        return a.numel() * b.shape[-1]
    if kind == 3:
        return b.shape[-2] if b.dim() >= 2 else 0
    return a.numel() // max(a.shape[1], 1) * b.numel()  # ~ N*H*W positions x Cout*(Cin/groups)*kh*kw (stride 1)


_NAMES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def compute_dtype(policy: str) -> tuple[torch.dtype | None, str]:
    """(the dtype float16 heavy ops compute in under ``policy``, why); None: as float16 (no rewrite).

    ``auto``: the CPU's flags choose (:mod:`~torch_adapter.core.cpu_features`); where they choose
    bfloat16, a one-off measurement (:mod:`~torch_adapter.core.cpu_speed`, cached on disk) keeps
    float32 on a CPU whose bfloat16 kernels are not faster (a VM hiding AMX, an emulation)."""
    from ..core.cpu_speed import float16_compute
    from .internal import internal

    if policy == "float16":
        return None, "float16_compute='float16'"
    if policy in _NAMES:
        return _NAMES[policy], f"float16_compute={policy!r}"
    with internal():  # the speed check's products are ours: no routing report counts them
        name, why = float16_compute()
    return _NAMES.get(name), f"{why}; float16_compute='auto'"


def attention_dtype() -> tuple[torch.dtype | None, str]:
    """(the dtype float16 attention computes in under ``auto``, why): the CPU's attention answer
    (:func:`~torch_adapter.core.cpu_speed.attention_compute`); any other policy computes attention in
    :func:`compute_dtype`'s dtype."""
    from ..core.cpu_speed import attention_compute
    from .internal import internal

    with internal():
        name, why = attention_compute()
    return _NAMES.get(name), f"{why}; float16_compute='auto'"


class _Rewrite:
    """The session's kernels and the compute dtype they read on every call (configure changes it)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.dtype: torch.dtype | None = None
        self.why = ""
        self.fp32_ops: frozenset[str] = frozenset(FP32_OPS)  # computed in float32 whatever self.dtype
        self.gate_fp32: frozenset[str] | None = None  # the fp32 set the C++ gate captured
        self.rules: dict[str, tuple[int, int, int, int]] = {}  # op -> its size rule under fp32_ops (_size_rule)
        self.decisions: dict[str, Any] = {}
        self.libs: list[Any] = []
        self.logged: set[str] = set()
        # parameter copies in the compute dtype: id -> (weakref, version, {(dtype, view geometry): copy})
        self.params: dict[int, tuple[Any, int, dict[tuple, torch.Tensor]]] = {}
        self.outputs = OutputCache()  # recent float16 outputs -> their compute-dtype originals
        self.lock = threading.Lock()
        self.hooked = False  # restored() is on the session's Patcher
        self.gate: Any = None  # the C++ float16 gate's module while its kernels are registered
        self.gate_state = ""  # "cpp", or what half_gate.ensure_built() said (the Python kernels serve)
        self.gate_names: list[str] = []  # the gate's op index -> name (its note(index) callback)
        self.registered = False

    def set_policy(self, policy: str) -> None:
        from .decide import Route, RouteDecision

        dtype, why = compute_dtype(policy)
        attention, attention_why = attention_dtype() if dtype is torch.bfloat16 and policy == "auto" else (dtype, why)
        fp32_ops = frozenset(FP32_OPS) | (frozenset(ATTENTION_OPS) if attention is torch.float32 else frozenset())
        with self.lock:
            self.dtype, self.why, self.fp32_ops = dtype, why, fp32_ops
            self.rules = {n: r for n in OPS if (r := _size_rule(n, fp32_ops)) is not None}
            short = str(dtype).replace("torch.", "")
            def small(name: str) -> str:
                rule = _size_rule(name, fp32_ops)
                if dtype is not torch.bfloat16 or rule is None:
                    return ""
                if rule[0] == 3:
                    return (f"; with under {rule[3]} key tokens in float32, where this CPU's bfloat16 attention "
                            f"backward is slower")
                return f"; products under {rule[3]:,} multiply-adds in float32"

            def reason(name: str) -> str:
                if name in ATTENTION_OPS and name in fp32_ops:
                    return f"float16 computed in float32 ({attention_why})"
                if name in FP32_OPS:
                    return (f"float16 computed in float32 (its float16 CPU kernel is slower than float32 with two "
                            f"casts; CUDA autocast computes it in float32 too; float16 in and out; float16_compute={policy!r})")
                return f"float16 computed in {short} ({why}{small(name)})"

            self.decisions = {name: RouteDecision(name, Route.COMPOSITE, reason(name), "low_precision") for name in OPS}
            if self.registered and self.gate is not None and dtype is not None and self.gate_fp32 != fp32_ops:
                self.destroy_locked()  # the gate captured another float32 set: captured again below
            if dtype is not None and not self.registered:
                self._register()
            elif dtype is None:
                self.destroy_locked()
            if self.gate is not None:
                self.gate.set_dtype(short if dtype is not None else "")  # (and empties its caches)
            self.params.clear()
            self.outputs.clear()

    def _register(self) -> None:
        """The C++ gate where it is built (the whole rewrite in C++: :mod:`.half_gate`), else the Python
        kernels on the CPU key and a background build of the gate for later sessions."""
        from . import half_gate, trace

        originals = {name: tp.host_kernel(name, "CPU") for name in OPS}
        originals = {name: k for name, k in originals.items() if k is not None}  # None: not in this build
        gate = half_gate.load()
        if gate is not None:
            self.gate_names = list(originals)
            gate.capture([_gate_spec(n, self.fp32_ops) for n in self.gate_names], "CPU")
            self.gate_fp32 = self.fp32_ops
            gate.set_output_cache_size(self.outputs.size)  # (the gate's caches are the process's: this session's size)
            gate.set_note(self._note_index)
            gate.set_noting(len(trace.active_logs()))
            trace.LISTENERS.append(gate.set_noting)  # told how many trace() blocks are open
            try:
                gate.install("CPU")
            except BaseException:
                trace.LISTENERS.remove(gate.set_noting)
                gate.set_note(None)
                raise
            self.gate = gate
            self.gate_state = "cpp"
            self.registered = True
            return
        lib = tp.kernel_library("aten")
        try:
            for name, original in originals.items():
                tp.register_python_kernel(lib, name, self._kernel(name, original, OPS[name]), "CPU")
        except BaseException:
            lib._destroy()
            raise
        self.libs.append(lib)
        self.registered = True
        self.gate_state = half_gate.ensure_built()

    def _note_index(self, index: int) -> None:
        """The gate's callback: its op ``index`` rewrote a call that must be logged (a trace() is open,
        or it is the op's first rewrite)."""
        self._note(self.gate_names[index])

    def cache_info(self) -> dict[str, int]:
        """What the caches hold now, whichever side keeps them: {params, outputs, hits, output_size}."""
        if self.gate is not None:
            return {k: int(v) for k, v in self.gate.cache_info().items()}
        return {"params": len(self.params), "outputs": len(self.outputs.entries), "hits": self.outputs.hits,
                "output_size": self.outputs.size}

    def set_output_cache_size(self, size: int) -> None:
        """How many recent float16 outputs keep their compute-dtype originals (0: none; tests)."""
        self.outputs.size, self.outputs.hits = size, 0
        if size == 0:
            self.outputs.clear()
        if self.gate is not None:
            self.gate.set_output_cache_size(size)
            self.gate.reset_hits()

    def restored(self) -> None:
        """The session's patches came off: so do the kernels (apply() puts them back at resume)."""
        with self.lock:
            self.hooked = False
            self.destroy_locked()
            self.params.clear()
            self.outputs.clear()

    def destroy_locked(self) -> None:
        if self.gate is not None:
            from . import trace

            self.gate.uninstall()
            self.gate.set_note(None)
            if self.gate.set_noting in trace.LISTENERS:
                trace.LISTENERS.remove(self.gate.set_noting)
            self.gate = None
        for lib in self.libs:
            lib._destroy()
        self.libs.clear()
        self.registered = False

    def _kernel(self, name: str, original: Any, outputs: tuple[int, ...] | None) -> Any:
        keep = _FP32_INPUTS.get(name)
        flag = _UNCHANGED_IF_TRUE.get(name)

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            dtype = self.dtype
            if dtype is None or not _all_half(args, kwargs, keep) or (flag is not None and args[flag]):
                return original.call_boxed(keyset, *args, **kwargs)
            rule = self.rules.get(name)
            if name in self.fp32_ops or (dtype is torch.bfloat16 and rule is not None and _macs(rule, args) < rule[3]):
                dtype = torch.float32  # a tiny product: bf16 kernels' set-up costs more than float32's work
            self._note(name)
            down = self.cast
            args = tuple(down(a, dtype) for a in args)
            kwargs = {k: down(v, dtype) for k, v in kwargs.items()}
            out = original.call_boxed(keyset, *args, **kwargs)
            up = self.up
            if outputs is None:
                return up(out, dtype)
            return tuple(up(o, dtype) if i in outputs else o for i, o in enumerate(out))

        kernel.__name__ = f"torch_adapter_low_precision_{name.partition('::')[2]}"
        return kernel

    def cast(self, a: Any, dtype: torch.dtype) -> Any:
        """``a`` in ``dtype`` if it is a float16 tensor; a parameter's copy is kept until it changes."""
        if not (isinstance(a, torch.Tensor) and a.dtype is _HALF):
            return a
        base = a._base if a._base is not None else a
        kind = type(base)  # exact types first: isinstance(x, Parameter) runs Parameter's Python metaclass
        if base.is_inference():  # no version counter (made under inference_mode): cast, keep nothing
            return _down(a, dtype)
        if kind is not _PARAMETER and (kind is torch.Tensor or not isinstance(base, _PARAMETER)):
            cached = self.outputs.get(a, base, dtype)  # our own recent output: its compute-dtype original
            return _down(a, dtype) if cached is None else cached
        entry = self.params.get(id(base))
        if entry is None or entry[0]() is not base or entry[1] != base._version:  # new, or changed in place
            ref = weakref.ref(base, lambda _r, k=id(base), d=self.params: d.pop(k, None))
            entry = self.params[id(base)] = (ref, base._version, {})
        key = (dtype, tuple(a.shape), a.stride(), a.storage_offset())
        out = entry[2].get(key)
        if out is None:
            out = entry[2][key] = _down(a, dtype)
        return out

    def up(self, c: Any, dtype: torch.dtype) -> Any:
        """The float16 result the program gets; ``c`` kept for the next rewritten call that takes it."""
        y16 = _up(c, dtype)
        if y16 is not c:
            self.outputs.put(y16, c)
        return y16

    def _note(self, name: str) -> None:
        """The call in the routing logs now open (as the engine's calls are) and, first time, the redirect log."""
        state, internal_active, active_logs = _note_hooks()
        d = self.decisions[name]
        if name not in self.logged:
            self.logged.add(name)
            self.session.redirect_log.record("low_precision", f"{name}(float16)", d.reason, depth=1)
        if internal_active():
            return
        if state.recorded == name:  # a trace() recorder counts this call: it records our decision
            state.decided = d
            return
        for log in active_logs():  # the observer counts it as native; trace() moves it over
            log.add_decision(d, calls=1, parent=state.parent, find_site=True)


def _gate_spec(name: str, fp32_ops: frozenset[str]) -> tuple:
    """The C++ gate's rewrite spec of ``name`` (the same rules as the Python kernel's; _half_gate.cpp Gate)."""
    outputs = OPS[name]
    return (name, _FP32_INPUTS.get(name, -1), _UNCHANGED_IF_TRUE.get(name, -1),
            [0] if outputs is None else list(outputs), name in fp32_ops, *(_size_rule(name, fp32_ops) or (0, 0, 1, 0)))


_HOOKS: tuple[Any, Any, Any] | None = None


def _note_hooks() -> tuple[Any, Any, Any]:
    """(the engine's per-thread state, internal.active, trace.active_logs), imported once (not per call)."""
    global _HOOKS
    if _HOOKS is None:
        from .engine import state
        from .internal import active
        from .trace import active_logs

        _HOOKS = (state, active, active_logs)
    return _HOOKS


def _all_half(args: tuple, kwargs: dict, keep: int | None) -> bool:
    """Every floating tensor argument float16 (one at least); else the CPU's kernel answers as it would."""
    seen = False
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and i != keep:
            if a.dtype is not _HALF:
                return False
            seen = True
    if not seen:
        return False
    return all(not (isinstance(v, torch.Tensor) and v.is_floating_point()) or v.dtype is _HALF
               for v in kwargs.values())


def _down(a: Any, dtype: torch.dtype) -> Any:
    if not (isinstance(a, torch.Tensor) and a.dtype is _HALF):
        return a
    if dtype is torch.float32:
        return a.float()
    return a.float().to(dtype)  # through float32: two vectorised casts are 3x faster than torch's direct one


def _up(a: Any, dtype: torch.dtype) -> Any:
    if not (isinstance(a, torch.Tensor) and a.dtype is dtype):
        return a
    # TensorBase's own half(), not the name torch.Tensor.half: under the dtype policy that name maps
    # float16 to float32 (redirect/dtype_policy.py), and a Half kernel must return Half
    return _TensorBase.half(a) if dtype is torch.float32 else _TensorBase.half(a.float())


def apply(session: Any) -> None:
    """Bring the kernels in line with ``session.config.float16_compute`` (install, resume, configure).
    They come off when the session's patches do (suspend, uninstall) and on again at resume."""
    target = session.target
    if target.device_type != "cpu" or target.simulated:
        return
    rewrite = getattr(session, "low_precision", None)
    if rewrite is None:
        rewrite = session.low_precision = _Rewrite(session)
    if not rewrite.hooked:
        rewrite.hooked = True
        session.patcher.after_restore(rewrite.restored)
    rewrite.set_policy(session.config.float16_compute)
