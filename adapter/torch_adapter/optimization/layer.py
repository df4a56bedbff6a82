"""The optimization layer: ``configure(optimization_level=..., ...)`` applied to an unchanged script.

While a session is installed, the models, optimizers and DDP wrappers the *script* creates
are adopted when they first run and changed as the session's options say (docs/tools.md
has the table per target):

==========================  ===================================================================
option                      what happens to the script's objects
==========================  ===================================================================
``optimization_level``      what :mod:`.levels` says (one table, shared with ``prepare()``):
                            ``conservative`` nothing (no hook installed); ``balanced`` fused
                            (else foreach) optimizer kernels where the target has them,
                            channels-last convolution models where the target's convolutions
                            prefer it (CUDA), autocast in the target's fast low precision where
                            it has one (CUDA: bf16/fp16; a CPU with bf16 units: bf16; never a
                            CPU without: bf16 is emulated there), outputs cast back to fp32;
                            ``aggressive`` balanced + each model that ran is ``torch.compile``\\ d
                            (its first step compiles: a note says how long)
``fusion_patterns``         ``["attention_blocks"]``: hand-written ``softmax(QKᵀ·s)V``
                            (matmul/bmm/@/einsum) runs as ``scaled_dot_product_attention``
                            (:mod:`._fusion`); each rewrite is listed in ``trace()``'s log
``gradient_checkpointing``  the model's own switch (diffusers/transformers), else a warning
``activation_checkpointing`` listed block classes run under ``torch.utils.checkpoint``; ``True``:
                            the model's own switch, else every block of its
                            ``nn.ModuleList``/``nn.Sequential`` containers (:func:`_blocks`)
``memory_strategy``         ``reuse``: DDP ``gradient_as_bucket_view=True``; ``aggressive``:
                            reuse + gradient checkpointing
``communication_bucket_size`` DDP ``bucket_cap_mb`` (unless the script passes its own)
==========================  ===================================================================

Mechanism apart from data: models are found by one global forward pre-hook (the first
module called that is not inside an adopted one is a model), optimizers by a global
optimizer step pre-hook, DDP by wrapping its ``__init__``. Every change is recorded with
its undo; a suspended session takes them off and puts them back on resume; ``uninstall()``
undoes them all (instance attributes deleted, optimizer flags restored). An undo finds what the
script already changed back itself (its own ``forward``, its own optimizer flags) and leaves it;
any other failure does not stop the rest, and one ``RestoreError`` names them all at the end.
What was applied: :func:`applied`.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
import weakref
from typing import Any

from ..core import torch_private as tp
from ..core.state import current
from .levels import OptimizeWarning, level

__all__ = ["apply", "applied", "OptimizeWarning", "plan_for"]


_FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # torch 2.13's fused Adam/AdamW/SGD kernels
# model -> the option sets its forward was compiled under (their first-call note is given once).
# Nothing here refers to the model (a value that did would keep its weak key alive forever):
# dynamo keeps the compiled graphs on the forward's code object, so a model adopted again by a
# later session (or after a resume) under the same options reuses them without this table.
_COMPILED: "weakref.WeakKeyDictionary[Any, set[tuple[Any, ...]]]" = weakref.WeakKeyDictionary()


def native_low_precision(device_type: str) -> Any:
    """The dtype the target computes fast in below fp32, or None (a CPU without bf16 or fp16 units:
    both are emulated there). The CPU's answer is :func:`torch_adapter.core.cpu_features.cpu_features`'s."""
    import torch

    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device_type == "cpu":
        from ..core.cpu_features import cpu_features

        name = cpu_features().fast_low_precision()
        return getattr(torch, name) if name else None
    if device_type in ("mps", "xpu", "npu"):
        return torch.float16
    return None


def plan_for(session: Any) -> dict[str, Any]:
    """What the session's options do on its target (JSON-able; docs/tools.md)."""
    import torch

    cfg, dev = session.config, session.target.device_type
    lv = level(cfg.optimization_level)
    dtype = None
    if lv.autocast and cfg.amp_dtype != "float32":
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(cfg.amp_dtype) or native_low_precision(dev)
    return {"fused_optimizers": lv.fast_optimizers and dev in _FUSED_DEVICES,
            "foreach_optimizers": lv.fast_optimizers and dev not in _FUSED_DEVICES,
            "channels_last": lv.channels_last and dev == "cuda", "autocast": str(dtype).replace("torch.", "") if dtype else None,
            "compile": lv.compile and not session.target.simulated,
            "trial": _trial_parts(session, lv, dtype),
            "fusion": tuple(cfg.fusion_patterns),
            "gradient_checkpointing": cfg.gradient_checkpointing or cfg.memory_strategy in ("aggressive", "low"),
            "activation_checkpointing": tuple(cfg.activation_checkpointing),
            "bucket_cap_mb": cfg.communication_bucket_size,
            "gradient_as_bucket_view": cfg.memory_strategy in ("reuse", "aggressive")}


def _trial_parts(session: Any, lv: Any, dtype: Any) -> tuple[str, ...]:
    """The level's parts measured on the program's step before they are kept (optimization/trial.py):
    on a real CPU target, ``compile`` and the autocast the level chose itself (not one the user asked
    for with ``mixed_precision``)."""
    from .trial import enabled

    if session.target.device_type != "cpu" or session.target.simulated or not enabled():
        return ()
    parts = []
    if lv.compile:
        parts.append("compile")
    if dtype is not None and lv.autocast and session.config.amp_dtype == "auto":
        parts.append("autocast")
    return tuple(parts)


# model -> {plan key: Trial}: a decision belongs to the model (kept across sessions)
_TRIALS: "weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]]" = weakref.WeakKeyDictionary()


class _Layer:
    """The optimization state of one session: hooks, adopted objects and their undos."""

    def __init__(self, session: Any) -> None:
        self.session = weakref.ref(session)
        self.plan: dict[str, Any] = {}
        self.hooks: list[Any] = []
        self.known: "weakref.WeakSet[Any]" = weakref.WeakSet()  # modules inside adopted models
        self.optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()  # optimizers seen
        self.undos: list[tuple[str, Any]] = []  # (what, undo), newest last
        self.applied: list[dict[str, Any]] = []
        self.lock = threading.RLock()
        self.on = False
        self.trial: Any = None  # optimization/trial.py: the parts on trial, for every model of this session
        self.trial_owner: Any = None  # a weakref to the model it belongs to
        self.cpu_kind = ""

    # -- on / off ----------------------------------------------------------------------------
    def start(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        session = self.session()
        self.plan = plan_for(session)
        p = self.plan
        if p["trial"]:  # the CPU's kind as the session was decided for (a forced kind in tests)
            from ..core.cpu_features import cpu_features

            features = cpu_features()
            self.cpu_kind = features.kind + (f", forced by {features.source}" if "=" in features.source
                                             or features.source.startswith("forced") else "")
        models = p["channels_last"] or p["autocast"] or p["compile"] or p["fusion"] or \
            p["gradient_checkpointing"] or p["activation_checkpointing"]
        if models:
            self.hooks.append(_ModelHook(self))
        if p["fused_optimizers"] or p["foreach_optimizers"]:
            self.hooks.append(register_optimizer_step_pre_hook(self._adopt_optimizer))
        if p["trial"]:
            self.hooks.append(register_optimizer_step_pre_hook(self._step_boundary))
        if p["bucket_cap_mb"] is not None or p["gradient_as_bucket_view"]:
            self._wrap_ddp(torch.nn.parallel.DistributedDataParallel)
        self.on = True

    def stop(self) -> None:
        """Undo everything, newest first; the layer can start again (resume). An undo that
        fails does not stop the others: one RestoreError names every failure at the end."""
        from ..errors import RestoreError

        failures: list[tuple[str, BaseException]] = []
        with self.lock:
            while self.hooks:
                hook = self.hooks.pop()
                try:
                    hook.remove()
                except Exception as exc:  # keep undoing; reported below
                    failures.append((f"optimization hook {type(hook).__name__}", exc))
            while self.undos:
                what, undo = self.undos.pop()
                try:
                    undo()  # returns quietly where the script already changed the object back
                except Exception as exc:
                    failures.append((f"optimization {what}", exc))
            self.known, self.optimizers = weakref.WeakSet(), weakref.WeakSet()
            self.on = False
            self.trial = self.trial_owner = None
        if failures:
            raise RestoreError(failures) from failures[0][1]

    def _record(self, what: str, obj: Any, undo: Any, **extra: Any) -> None:
        self.undos.append((f"{what} of {type(obj).__name__}", undo))
        self.applied.append({"what": what, "object": type(obj).__name__, **extra})

    # -- models ------------------------------------------------------------------------------
    def _adopt_module(self, module: Any, args: Any) -> None:
        import torch

        if torch.compiler.is_compiling() or module in self.known:
            return
        with self.lock:
            if module in self.known or not self.on:
                return
            for m in module.modules():
                self.known.add(m)
            params = next(module.parameters(), None) is not None
            if hasattr(module, "_orig_mod") or not (params or self.plan["fusion"]):
                return  # compiled by the script (prepare()), or a loss/activation module: left as it is
            try:
                self._optimize_model(module, params)
            except Exception as exc:  # instrumentation never breaks user code
                warnings.warn(f"torch_adapter: the optimization layer could not adapt {type(module).__name__} "
                              f"({type(exc).__name__}: {exc}); it runs as written", OptimizeWarning, stacklevel=3)

    def _optimize_model(self, model: Any, params: bool = True) -> None:
        import torch

        p = self.plan
        if p["fusion"]:
            from . import fusion as _fusion

            for _ in _fusion.rewrite_attention(model, self._set_forward):
                pass  # each rewrite is recorded (with its undo and site) by _set_forward
        if not params:
            return
        if p["gradient_checkpointing"]:
            self._checkpointing(model)
        listed = p["activation_checkpointing"]
        if listed == ("*",):  # True: the model's own switch, else the blocks of its containers
            blocks = [] if self._checkpointing(model, warn=False) else _blocks(model)
        else:
            blocks = [(name, sub) for name, sub in model.named_modules() if listed and _listed(sub, listed)]
        for name, sub in blocks:
            self._set_forward(sub, _checkpointed(_forward_of(sub)), "activation_checkpointing", site=name)
        if p["channels_last"] and any(isinstance(m, torch.nn.Conv2d) for m in model.modules()):
            model.to(memory_format=torch.channels_last)
            self._record("channels_last", model, lambda m=weakref.ref(model): m() and m().to(
                memory_format=torch.contiguous_format))
        if p["autocast"] or p["compile"]:
            self._set_forward(model, self._switched(model, _forward_of(model)),
                              "+".join(k for k in ("autocast", "compile") if p[k]), dtype=p["autocast"])

    def _switched(self, model: Any, base: Any) -> Any:
        """``base`` under the level's autocast and compile, each as the trial (if any) has it now: the
        variants are made at their first use (a compiled one compiles then) and kept."""
        import torch

        p = self.plan
        device = self.session().target.device_type
        dtype = getattr(torch, p["autocast"]) if p["autocast"] else None
        trial = self._trial_for(model)
        fixed = {"autocast": dtype is not None, "compile": bool(p["compile"])}
        variants: dict[tuple[bool, bool], Any] = {}
        owner = trial is not None and self.trial_owner is not None and self.trial_owner() is model

        def variant(autocast: bool, compiled: bool) -> Any:
            fn = variants.get((autocast, compiled))
            if fn is None:
                fn = _autocast(base, device, dtype) if autocast else base
                if compiled:
                    fn = self._compiled(model, fn, p["autocast"] if autocast else None)
                variants[(autocast, compiled)] = fn
            return fn

        variant(fixed["autocast"], fixed["compile"])  # the level's own now (torch.compile itself is lazy)

        @functools.wraps(base)
        def run(*args: Any, **kwargs: Any) -> Any:
            state = trial.state if trial is not None else fixed
            autocast = fixed["autocast"] and state.get("autocast", True)
            compiled = fixed["compile"] and state.get("compile", True) and not torch.compiler.is_compiling()
            fn = variant(autocast, compiled)
            if not owner or trial.done or torch.is_grad_enabled():
                return fn(*args, **kwargs)
            t0 = time.perf_counter()  # inference: the model's call is the step the trial times
            out = fn(*args, **kwargs)
            trial.forward_done(time.perf_counter() - t0)
            return out

        return run

    def _trial_for(self, model: Any) -> Any:
        """The session's trial (optimization/trial.py): made for the first model adopted, or found on it
        (a later session, the same model), shared by every model this session adopts."""
        p = self.plan
        if not p["trial"]:
            return None
        if self.trial is None:
            from .trial import Trial

            key = (p["trial"], p["autocast"], p["fusion"], self.session().config.optimization_level)
            per_model = _TRIALS.setdefault(model, {})
            if key not in per_model:
                per_model[key] = Trial(list(p["trial"]), level=self.session().config.optimization_level,
                                       device=self.session().target.device_type, dtype=p["autocast"],
                                       kind=self.cpu_kind)
            self.trial, self.trial_owner = per_model[key], weakref.ref(model)
        return self.trial

    def _step_boundary(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        trial = self.trial
        if trial is None or trial.done:
            return
        trial.step_boundary(optimizer)
        listed = {a.get("trial") for a in self.applied}
        for part, row in trial.decided.items():
            if part not in listed:  # each decision once in applied(): what was measured, kept or not
                owner = self.trial_owner() if self.trial_owner is not None else None
                self.applied.append({"what": f"trial:{part}", "object": type(owner).__name__, "trial": part, **row})

    def _set_forward(self, module: Any, forward: Any, what: str, **extra: Any) -> None:
        had = "forward" in module.__dict__
        before = module.__dict__.get("forward")
        module.forward = forward
        ref = weakref.ref(module)

        def undo() -> None:
            m = ref()
            if m is None or m.__dict__.get("forward") is not forward:
                return  # gone, or the script set a forward of its own since: it stays
            if had:
                m.forward = before
            else:
                m.__dict__.pop("forward", None)

        self._record(what, module, undo, **extra)

    def _compiled(self, model: Any, forward: Any, autocast: Any) -> Any:
        import torch

        p = self.plan
        key = (self.session().target.device_type, autocast, p["fusion"], p["activation_checkpointing"],
               p["gradient_checkpointing"])
        done = _COMPILED.setdefault(model, set())
        compiled = torch.compile(forward)  # lazy; dynamo reuses its graphs for a forward it compiled
        first = [key not in done]
        done.add(key)
        name = type(model).__name__  # the wrapper holds no reference to the model but through forward

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not first[0]:
                return compiled(*args, **kwargs)
            first[0] = False
            t0 = time.perf_counter()
            out = compiled(*args, **kwargs)
            warnings.warn(f"torch_adapter (optimization_level='aggressive'): compiled {name}'s "
                          f"forward in {time.perf_counter() - t0:.1f} s (first call; the backward compiles at the "
                          f"first backward). Later steps reuse it", OptimizeWarning, stacklevel=2)
            return out

        return run

    def _checkpointing(self, model: Any, warn: bool = True) -> bool:
        for on, off in (("enable_gradient_checkpointing", "disable_gradient_checkpointing"),
                        ("gradient_checkpointing_enable", "gradient_checkpointing_disable")):
            if callable(getattr(model, on, None)):
                was = bool(getattr(model, "is_gradient_checkpointing", False))
                getattr(model, on)()
                if not was:
                    self._record("gradient_checkpointing", model, functools.partial(_switch_off, weakref.ref(model),
                                                                                   off))
                return True
        if not warn:
            return False
        warnings.warn(f"torch_adapter: gradient_checkpointing: {type(model).__name__} has no gradient-checkpointing "
                      f"switch; list its block classes in configure(activation_checkpointing=[...]) instead",
                      OptimizeWarning, stacklevel=5)
        return False

    # -- optimizers ------------------------------------------------------------------------------
    def _adopt_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer in self.optimizers:
            return
        with self.lock:
            self.optimizers.add(optimizer)
            flag = "fused" if self.plan["fused_optimizers"] else "foreach"
            changed = []
            for group in optimizer.param_groups:
                if flag not in group or group.get("fused") or group.get("foreach") or group.get("differentiable"):
                    continue  # the optimizer has no such kernel, or the script chose one
                if flag == "fused" and not all(p.is_floating_point() for p in group["params"]):
                    continue
                changed.append((group, group.get("foreach"), group.get("fused")))
                group[flag] = True
                if flag == "fused":
                    group["foreach"] = False
            if not changed:
                return

            def undo() -> None:
                for group, foreach, fused in changed:
                    if group.get(flag) is True:  # else the script chose its kernel since: it stays
                        group["foreach"], group["fused"] = foreach, fused

            self._record(f"optimizer:{flag}", optimizer, undo)

    # -- DDP -----------------------------------------------------------------------------------
    def _wrap_ddp(self, ddp: type) -> None:
        p = self.plan
        original = ddp.__dict__["__init__"]

        @functools.wraps(original)
        def __init__(module_self: Any, *args: Any, **kwargs: Any) -> None:
            if p["bucket_cap_mb"] is not None and "bucket_cap_mb" not in kwargs:
                kwargs["bucket_cap_mb"] = p["bucket_cap_mb"]
            if p["gradient_as_bucket_view"] and "gradient_as_bucket_view" not in kwargs:
                kwargs["gradient_as_bucket_view"] = True
            original(module_self, *args, **kwargs)

        ddp.__init__ = __init__  # type: ignore[method-assign]

        def undo() -> None:
            if ddp.__dict__.get("__init__") is __init__:  # else replaced since by the script: it stays
                ddp.__init__ = original  # type: ignore[method-assign]

        self._record("ddp", ddp, undo, bucket_cap_mb=p["bucket_cap_mb"])


class _ModelHook:
    """The layer's one global forward pre-hook, under the same key and function in every session.
    Dynamo guards compiled code on the global hooks (their keys, the hook functions): a new
    registration per session (a new handle id, a new bound method) would make every compiled
    model recompile after each ``adapted()`` block — measured: an aggressive step 4x slower than
    eager when sessions are entered per block."""

    key: Any = None  # the key torch gave the first registration; reused (torch never reissues it)
    layer: Any = None

    def __init__(self, layer: _Layer) -> None:
        _ModelHook.layer = layer
        _ModelHook.key = tp.add_global_forward_pre_hook(_adopt_hook, _ModelHook.key)

    def remove(self) -> None:
        tp.remove_global_forward_pre_hook(_ModelHook.key)
        _ModelHook.layer = None


def _adopt_hook(module: Any, args: Any) -> None:
    import torch

    if torch.compiler.is_compiling():  # first: compiled code traces no state (no guard on the layer)
        return
    layer = _ModelHook.layer
    if layer is not None:
        layer._adopt_module(module, args)


def _forward_of(module: Any) -> Any:
    return module.__dict__.get("forward") or module.forward


def _listed(module: Any, names: tuple[str, ...]) -> bool:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}" in names or cls.__name__ in names


def _switch_off(ref: Any, off: str) -> None:
    model = ref()
    if model is not None and getattr(model, "is_gradient_checkpointing", True):  # else switched off already
        getattr(model, off)()


def _blocks(module: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """The elements (with parameters) of the outermost ``nn.ModuleList``/``nn.Sequential``
    containers under ``module``: a transformer's layers, a ResNet stage's blocks."""
    import torch

    if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
        return [(prefix + n, c) for n, c in module.named_children() if next(c.parameters(), None) is not None]
    return [b for n, c in module.named_children() for b in _blocks(c, f"{prefix}{n}.")]


def _checkpointed(forward: Any) -> Any:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def _autocast(forward: Any, device_type: str, dtype: Any) -> Any:
    """``forward`` under autocast(device_type, dtype) unless the script opened one; low-precision
    floating outputs come back as float32, so the script sees the dtypes it was written for."""
    import torch

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_autocast_enabled(device_type):
            return forward(*args, **kwargs)
        with torch.autocast(device_type, dtype=dtype):
            out = forward(*args, **kwargs)
        return _to_fp32(out, dtype)

    return run


def _to_fp32(out: Any, dtype: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == dtype else out
    if isinstance(out, dict):
        for key, value in list(out.items()):
            if isinstance(value, torch.Tensor) and value.dtype == dtype:
                out[key] = value.float()
        return out
    if isinstance(out, (tuple, list)) and type(out) in (tuple, list):
        return type(out)(_to_fp32(o, dtype) for o in out)
    return out


def _layer(session: Any, create: bool = True) -> _Layer | None:
    layer = getattr(session, "optimizer_layer", None)
    if layer is None and create:
        layer = session.optimizer_layer = _Layer(session)
        session.suspenders.append((layer.stop, layer.start))
    return layer


def apply(session: Any, old: Any) -> None:
    """Bring the layer in line with ``session.config`` (called at install and configure)."""
    layer = _layer(session, create=plan_needed(session))
    if layer is None:
        return
    if old is not None and layer.on and plan_for(session) == layer.plan:
        return
    layer.stop()
    if plan_needed(session):
        layer.start()


def plan_needed(session: Any) -> bool:
    p = plan_for(session)
    return any(v for v in p.values())


def applied(session: Any = None) -> list[dict[str, Any]]:
    """What the layer changed in this session so far: one row per object and change."""
    session = session if session is not None else current()
    layer = _layer(session, create=False) if session is not None else None
    return list(layer.applied) if layer is not None else []
