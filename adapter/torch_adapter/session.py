"""The adapter session: install(), uninstall(), adapted(), configure().

One :class:`AdapterSession` at a time holds everything installed: the target, the
config, the :class:`~torch_adapter.patching.Patcher` with every patch, the redirect log,
the routing engine (when ops are enforced: simulated targets, fallback policies) and the
registry of user extensions. ``uninstall()`` closes it and torch is exactly as before.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Iterator

from .errors import UsageError, format_error
from .patching import Patcher
from .target import Target, resolve

__all__ = ["AdapterSession", "Config", "install", "uninstall", "adapted", "configure", "current"]

_LOCK = threading.RLock()
_SESSION: "AdapterSession | None" = None

AMP_POLICIES = ("auto", "float16", "bfloat16", "float32")
# The tools' options (docs/tools.md). mixed_precision is another spelling of amp_dtype.
OPTIMIZATION_LEVELS = ("conservative", "balanced", "aggressive")
MEMORY_STRATEGIES = ("default", "low")
DEBUG_MODES = (False, True, "raise", "warn", "compare")
MIXED_PRECISION = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", None: "auto"}
COLLECTIVE_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "hccl", "xccl")


@dataclass
class Config:
    """Everything `install()`/`configure()` can set. Each field is documented in docs/."""

    # AMP: what autocast("cuda", dtype) becomes. "auto" keeps float16 where the target
    # computes it well and uses bfloat16 on the CPU (float16 matmuls there are emulated).
    amp_dtype: str = "auto"
    # Fallback policy for ops the target lacks (routing engine): allow | warn | error.
    fallback: str = "allow"
    force_cpu: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    # Child processes (mp.spawn, DataLoader spawn workers, subprocesses) adapted too.
    propagate: bool = False
    # Record call sites of redirections (cheap: once per distinct call site).
    log_redirects: bool = True
    # The collective backend that "nccl" becomes; None = the target's own.
    communication_backend: str | None = None
    # What torch_adapter.prepare(model) does: eager | torch.compile | compile(mode="max-autotune").
    optimization_level: str = "conservative"
    # "low": prepare(model) turns on the model's gradient checkpointing.
    memory_strategy: str = "default"
    # NaN/Inf check (True/"raise", "warn") and CPU compare ("compare"), torch_adapter.debug.
    debug_mode: bool | str = False
    # Serve memory figures to `torch-adapter memory --pid` (or TORCH_ADAPTER_MEMORY_SERVER=1).
    memory_server: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}

    @property
    def mixed_precision(self) -> str | None:
        """``amp_dtype`` as ``configure(mixed_precision=...)`` spells it: "fp16", "bf16", "fp32" or None (auto)."""
        return {v: k for k, v in MIXED_PRECISION.items()}[self.amp_dtype]


class AdapterSession:
    """The installed state. Obtain it from :func:`install` or :func:`current`."""

    def __init__(self, target: Target, config: Config) -> None:
        from .redirect.log import RedirectLog

        self.target = target
        self.config = config
        self.patcher = Patcher()
        self.redirect_log = RedirectLog()
        self.routing: Any = None  # routing engine handle, when ops are enforced
        self.registry: Any = None  # user registrations (routing.registry), created on first use
        self.closers: list[Any] = []  # callables run on close, newest first
        self.active = False

    def __repr__(self) -> str:
        state = "installed" if self.active else "closed"
        return f"<AdapterSession target={self.target.label!r} {state}, {len(self.patcher)} patches>"

    # -- lifecycle ---------------------------------------------------------------
    def _open(self) -> None:
        from ._session_tools import apply as apply_tools
        from .redirect import apply_all

        try:
            apply_all(self)
            if self.target.simulated or self.config.fallback != "allow" or self.config.force_cpu or self.config.deny:
                self._attach_routing()
            apply_tools(self, None)
        except BaseException:
            self._close()
            raise
        self.active = True

    def _attach_routing(self) -> None:
        if self.routing is None:
            from .routing import engine

            self.routing = engine.attach(self)

    def _close(self) -> None:
        errors: list[BaseException] = []
        if self.routing is not None:
            try:
                self.routing.detach()
            except BaseException as exc:  # keep restoring; report after
                errors.append(exc)
            self.routing = None
        while self.closers:
            closer = self.closers.pop()
            try:
                closer()
            except BaseException as exc:
                errors.append(exc)
        self.patcher.restore()
        self.active = False
        if errors:
            raise errors[0]

    def same_as(self, target: Target, config: Config) -> bool:
        return self.target == target and self.config.as_dict() == config.as_dict()

    def settings(self) -> dict[str, Any]:
        """What a child process needs to install the same session (JSON-able)."""
        cfg = self.config.as_dict()
        cfg["force_cpu"] = list(cfg["force_cpu"])
        cfg["deny"] = list(cfg["deny"])
        return {"target": self.target.name, "simulate": self.target.simulated, **cfg}

    # -- user-facing -----------------------------------------------------------------
    def uninstall(self) -> None:
        uninstall()

    def summary(self) -> dict[str, Any]:
        return {"target": self.target.label, "device": self.target.device_type,
                "config": self.config.as_dict(), "patches": len(self.patcher),
                "redirects": self.redirect_log.summary()}


def _make_config(kwargs: dict[str, Any], base: Config | None = None) -> Config:
    cfg = Config(**(base.as_dict() if base else {}))
    names = {f.name for f in fields(Config)} - {"extra"}
    for key, value in kwargs.items():
        if key == "mixed_precision":
            _set_mixed_precision(cfg, value, kwargs)
            continue
        if key not in names:
            raise UsageError(format_error(
                "torch_adapter.install()/configure()", f"keyword arguments among {sorted(names | {'mixed_precision'})}",
                repr(key), fix="check the spelling; see help(torch_adapter.install)"))
        if key in ("force_cpu", "deny"):
            value = (value,) if isinstance(value, str) else tuple(value or ())
        setattr(cfg, key, value)
    if cfg.amp_dtype not in AMP_POLICIES:
        raise UsageError(format_error(
            "torch_adapter.install(amp_dtype=...)", f"one of {AMP_POLICIES}", repr(cfg.amp_dtype),
            why="it decides what autocast('cuda', float16) becomes on the target",
            fix='e.g. amp_dtype="bfloat16"'))
    if cfg.fallback not in ("allow", "warn", "error"):
        raise UsageError(format_error(
            "torch_adapter.configure(fallback=...)", "'allow', 'warn' or 'error'", repr(cfg.fallback),
            fix='e.g. configure(fallback="warn")'))
    _check_tool_options(cfg)
    return cfg


def _set_mixed_precision(cfg: Config, value: Any, kwargs: dict[str, Any]) -> None:
    call = "torch_adapter.configure(mixed_precision=...)"
    if not isinstance(value, (str, type(None))) or value not in MIXED_PRECISION:
        raise UsageError(format_error(call, "one of 'fp16', 'bf16', 'fp32' or None", f"{value!r}",
                                      why="it sets the AMP dtype policy (amp_dtype) that autocast('cuda') follows",
                                      fix='e.g. configure(mixed_precision="bf16")'))
    dtype = MIXED_PRECISION[value]
    if "amp_dtype" in kwargs and kwargs["amp_dtype"] != dtype:
        raise UsageError(format_error(call, f"amp_dtype={dtype!r} or no amp_dtype beside mixed_precision={value!r}",
                                      f"amp_dtype={kwargs['amp_dtype']!r}", why="both set the one AMP policy",
                                      fix="pass only one of them"))
    cfg.amp_dtype = dtype


def _check_tool_options(cfg: Config) -> None:
    """The tools' options: each must be one of its documented values (docs/tools.md)."""
    choices: dict[str, tuple[Any, ...]] = {"optimization_level": OPTIMIZATION_LEVELS,
                                           "memory_strategy": MEMORY_STRATEGIES, "debug_mode": DEBUG_MODES,
                                           "memory_server": (False, True)}
    for key, valid in choices.items():
        value = getattr(cfg, key)
        if not any(type(value) is type(v) and value == v for v in valid):
            raise UsageError(format_error(
                f"torch_adapter.configure({key}=...)", f"one of {', '.join(map(repr, valid))}",
                f"{value!r} ({type(value).__name__})", fix=f"e.g. configure({key}={valid[1]!r}); see docs/tools.md"))
    backend = cfg.communication_backend
    if backend is not None:
        valid_backends = _collective_backends()
        if not isinstance(backend, str) or backend.lower() not in valid_backends:
            raise UsageError(format_error(
                "torch_adapter.configure(communication_backend=...)", f"None or one of {', '.join(valid_backends)}",
                f"{backend!r}", why='it replaces "nccl" in init_process_group / new_group',
                fix='e.g. configure(communication_backend="gloo")'))
        cfg.communication_backend = backend.lower()


def _collective_backends() -> list[str]:
    names = set(COLLECTIVE_BACKENDS)
    try:
        import torch.distributed as dist

        names |= {str(b).lower() for b in getattr(dist.Backend, "backend_list", [])}
    except ImportError:  # a torch built without distributed
        pass
    names.discard("undefined")
    return sorted(names)


def install(target: str | Target = "auto", *, simulate: bool = False, **options: Any) -> AdapterSession:
    """Install the adapter: CUDA-written code now runs on ``target``.

    ``target`` is ``"auto"`` (the best present: cuda > npu > xpu > mps > cpu) or a name;
    ``simulate=True`` previews another backend's routing while executing on this machine.
    Options: ``amp_dtype`` ("auto" | "float16" | "bfloat16" | "float32"; or
    ``mixed_precision`` "fp16" | "bf16" | "fp32" | None), ``fallback`` ("allow" | "warn" |
    "error"), ``force_cpu``, ``deny``, ``propagate`` (adapt child processes too),
    ``communication_backend``, ``log_redirects``, and for the tools (docs/tools.md)
    ``optimization_level`` ("conservative" | "balanced" | "aggressive"), ``memory_strategy``
    ("default" | "low"), ``debug_mode`` (False | True | "raise" | "warn" | "compare") and
    ``memory_server`` (also on with TORCH_ADAPTER_MEMORY_SERVER=1).

    Installing again with the same settings returns the same session; with other settings
    the old session is closed first. ``uninstall()`` restores torch exactly.
    """
    global _SESSION
    with _LOCK:
        tgt = resolve(target, simulate=simulate)
        if "memory_server" not in options:
            from ._memory_server import env_enabled

            if env_enabled():
                options = {**options, "memory_server": True}
        cfg = _make_config(options)
        if _SESSION is not None:
            if _SESSION.same_as(tgt, cfg):
                return _SESSION
            uninstall()
        session = AdapterSession(tgt, cfg)
        session._open()
        _SESSION = session
        return session


def uninstall() -> None:
    """Remove every patch and hook; torch is as it was before install(). Safe to call twice."""
    global _SESSION
    with _LOCK:
        session, _SESSION = _SESSION, None
        if session is not None:
            session._close()


def current() -> AdapterSession | None:
    """The installed session, or None."""
    return _SESSION


@contextlib.contextmanager
def adapted(target: str | Target = "auto", *, simulate: bool = False, **options: Any) -> Iterator[AdapterSession]:
    """``with adapted(target="cpu"):`` — installed inside the block, restored after.

    If a session was installed before the block, it is put back afterwards.
    """
    previous = _SESSION
    prev_settings = previous.settings() if previous is not None else None
    session = install(target, simulate=simulate, **options)
    try:
        yield session
    finally:
        if session is not previous:
            uninstall()
            if prev_settings is not None:
                install(**prev_settings)


def configure(**options: Any) -> Config:
    """Change the installed session's settings at once (scoped to that session).

    Accepts the same options as :func:`install`. Routing options (``fallback``,
    ``force_cpu``, ``deny``) take effect for the next op; ``debug_mode`` and
    ``memory_server`` at once; ``optimization_level``/``memory_strategy`` for the next
    ``torch_adapter.prepare(model)``. An invalid value raises UsageError listing the valid ones.
    """
    with _LOCK:
        session = _SESSION
        if session is None:
            raise UsageError(format_error(
                "torch_adapter.configure()", "an installed adapter", "none installed",
                fix="call torch_adapter.install() first, or use install(..., fallback=...)"))
        cfg = _make_config(options, base=session.config)
        if cfg.force_cpu or cfg.deny:  # unknown op names fail here, before anything changes
            from .routing.policy import make_policy
            from .routing.profiles import profile_for

            make_policy(cfg, profile_for(session.target))
        old, session.config = session.config, cfg
        if cfg.fallback != "allow" or cfg.force_cpu or cfg.deny or session.target.simulated:
            session._attach_routing()
        if session.routing is not None:
            session.routing.reconfigure(cfg)
        from ._session_tools import apply as apply_tools

        apply_tools(session, old)
        return session.config
