"""The adapter session: install(), uninstall(), adapted(), configure().

One :class:`AdapterSession` is *active* at a time and holds everything installed: the
target, the config, the :class:`~torch_adapter.core.patching.Patcher` with every patch, the
redirect log, the routing engine (when ops are enforced: simulated targets, fallback
policies), the registry of user extensions and the optimization layer. ``uninstall()``
closes it and torch is exactly as before.

**The stack.** A nested ``adapted()`` block with other settings, ``%%adapter_compare`` and
``%adapter target`` *suspend* the active session (its patches, engine kernels, module
replacements, debug checks and optimizations come off; its config, registrations, policy,
logs and handle stay) and *resume* it intact afterwards: the same object, active again.
The current-session state lives in :mod:`torch_adapter.core.state`, which every layer reads.

**Threads.** The session is process-wide: every thread runs on the active one. A thread
may share it (``adapted()`` with the same settings yields it; the last block to leave
closes it), but installing *other* settings while a session installed by another live
thread is active raises :class:`~torch_adapter.errors.UsageError`: that switch would
silently move the other thread's ops too.

**Validation first.** Every option, the target and the op names of a policy are checked
before anything is touched; a failed ``install()`` leaves the previous session working.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from .core import state as _state
from .core.state import current
from .core.config import (AMP_POLICIES, COLLECTIVE_BACKENDS, DEBUG_MODES, MEMORY_STRATEGIES, MIXED_PRECISION, OPTIMIZATION_LEVELS, Config, make_config)
from .errors import UsageError, format_error
from .core.patching import Patcher
from .routing.target import Target, resolve

__all__ = ["AdapterSession", "Config", "install", "uninstall", "adapted", "configure", "current", "suspended",
           "switch"]

_LOCK = _state.LOCK


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
        self.suspenders: list[tuple[Any, Any]] = []  # (suspend, resume) pairs of what the session applied
        self.active = False
        self.suspended = False
        self.closed = False
        self.owner = threading.current_thread()  # the thread that installed it
        self._blocks = 0  # adapted() blocks now inside this session (any thread)
        self._outer: list[Any] = []  # what adapted() resumes when its last block leaves

    def __repr__(self) -> str:
        state = "installed" if self.active else "suspended" if self.suspended else "closed"
        return f"<AdapterSession target={self.target.label!r} {state}, {len(self.patcher)} patches>"

    # -- lifecycle ---------------------------------------------------------------
    def _open(self) -> None:
        from .tools.session_tools import apply as apply_tools

        try:
            self._redirect()
            self._apply_low_precision()
            if self._enforces(self.config):
                self._attach_routing()
            apply_tools(self, None)
            self._apply_optimizations(None)
        except BaseException as exc:
            try:
                self._close()
            except BaseException as undo:  # the install error stays the one raised; the undo's is noted
                exc.add_note(f"torch_adapter: undoing the failed install also failed: {undo}")
            raise
        self.active = True

    def _enforces(self, cfg: Config) -> bool:
        """Whether the routing engine runs: simulated targets, policies, and every real device target
        other than the host (ops it lacks that a decomposition covers run decomposed, as routed)."""
        on_device = not self.target.simulated and self.target.device_type not in ("cpu", "cuda")
        return bool(self.target.simulated or on_device or cfg.fallback != "allow" or cfg.force_cpu or cfg.deny
                    or cfg.max_fallbacks is not None)

    def _apply_low_precision(self) -> None:
        from .routing import low_precision

        from .redirect import dtype_policy

        low_precision.apply(self)  # float16 heavy ops in the CPU's fast dtype (routing/low_precision.py)
        dtype_policy.apply(self)  # what float16 requests give, from that decision (redirect/dtype_policy.py)

    def _apply_optimizations(self, old: Config | None) -> None:
        from .optimization import layer as optimizing

        optimizing.apply(self, old)

    def _attach_routing(self) -> None:
        if self.routing is None:
            from .routing import engine

            self.routing = engine.attach(self)

    def _suspend(self) -> None:
        """Take everything off torch, keep the state: :meth:`_resume` puts it back as it was."""
        errors: list[BaseException] = []
        for suspend, _ in reversed(self.suspenders):
            try:
                suspend()
            except BaseException as exc:  # keep suspending; report after
                errors.append(exc)
        if self.routing is not None:
            try:
                self.routing.detach()
            except BaseException as exc:
                errors.append(exc)
        try:
            self.patcher.restore()  # all or nothing: every patch and hook comes off, then one error
        except BaseException as exc:
            errors.append(exc)
        self.active, self.suspended = False, True
        if errors:
            raise errors[0]

    def _redirect(self) -> None:
        """Every redirect surface on the Patcher; with ``propagate``, the settings handed on to
        child processes (their start-up hook installs the same session)."""
        from .core.config import CHILD_SETTINGS_ENV, encode_child_settings
        from .redirect.install import apply_all

        apply_all(self)
        if self.config.propagate:
            self.patcher.set_env(CHILD_SETTINGS_ENV, encode_child_settings(self.settings()))

    def _resume(self) -> None:
        self._redirect()
        self._apply_low_precision()
        if self.routing is not None:
            self.routing.refresh()
        for _, resume in self.suspenders:
            resume()
        self.active, self.suspended = True, False

    def _close(self) -> None:
        errors: list[BaseException] = []
        if self.routing is not None:
            try:
                self.routing.detach()
            except BaseException as exc:  # keep restoring; report after
                errors.append(exc)
            self.routing = None
        if not self.suspended:  # a suspended session has taken its changes off already
            for suspend, _ in reversed(self.suspenders):
                try:
                    suspend()
                except BaseException as exc:
                    errors.append(exc)
        self.suspenders.clear()
        while self.closers:
            closer = self.closers.pop()
            try:
                closer()
            except BaseException as exc:
                errors.append(exc)
        try:
            self.patcher.restore()  # all or nothing (Patcher.restore)
        except BaseException as exc:
            errors.append(exc)
        self.active = self.suspended = False
        self.closed = True
        if errors:
            raise errors[0]

    def same_as(self, target: Target, config: Config) -> bool:
        return self.target == target and self.config.as_dict() == config.as_dict()

    def settings(self) -> dict[str, Any]:
        """What a child process needs to install the same session (JSON-able). A session
        simulating a ``.toml`` profile names the file, so it installs again from it."""
        cfg = self.config.as_dict()
        for key in ("force_cpu", "deny", "allow", "fusion_patterns", "activation_checkpointing"):
            cfg[key] = list(cfg[key])
        profile = str(self.target.details.get("profile", "")) if self.target.simulated else ""
        name = profile if profile.endswith(".toml") else self.target.name
        out = {"target": name, "simulate": self.target.simulated, **cfg}
        if self.target.emulated:
            out["emulate"] = True
        return out

    # -- user-facing -----------------------------------------------------------------
    def uninstall(self) -> None:
        uninstall()

    def summary(self) -> dict[str, Any]:
        return {"target": self.target.label, "device": self.target.device_type,
                "config": self.config.as_dict(), "patches": len(self.patcher),
                "redirects": self.redirect_log.summary()}


def _prepare(target: Any, simulate: Any, options: dict[str, Any], call: str,
             emulate: Any = False) -> tuple[Target, Config]:
    """Check everything an install needs — target, options, policy op names — touching nothing
    (an emulated target's device is started: a process-wide device, as importing torch_npu is)."""
    for flag, value, example in (("simulate", simulate, "install('mps', simulate=True)"),
                                 ("emulate", emulate, "install('npu', emulate=True)")):
        if not isinstance(value, bool):
            raise UsageError(format_error(f"{call}({flag}=...)", "True or False", f"{value!r} ({type(value).__name__})",
                                          fix=f"e.g. {example}"))
    tgt = resolve(target, simulate=simulate, emulate=emulate)
    if "memory_server" not in options:
        from .tools.memory_server import env_enabled

        if env_enabled():
            options = {**options, "memory_server": True}
    cfg = make_config(options)
    _check_policy(tgt, cfg)
    if tgt.emulated and cfg.device_count is not None:
        from . import emulated

        em = emulated.active()
        if em is not None and em.device_count != cfg.device_count:
            em.set_device_count(cfg.device_count)
        from dataclasses import replace

        tgt = replace(tgt, device_count=cfg.device_count)
    return tgt, cfg


def _check_policy(tgt: Target, cfg: Config) -> None:
    if cfg.device_count is not None and tgt.device_type != "cpu" and not tgt.emulated:
        raise UsageError(format_error(
            "torch_adapter.install()/configure(device_count=...)",
            "a target whose CUDA indices all name the CPU (cpu, or a simulated target) or an emulated one",
            f"device_count={cfg.device_count} on target {tgt.label!r}",
            why=f"on {tgt.name} every CUDA index names one of its own {tgt.device_count} device(s): "
                "torch.cuda.device_count() answers that count",
            fix="leave device_count unset on this target (or use target='cpu' to run the ranks on the CPU, or "
                "target='npu' with emulate=True for an emulated device with that many devices)"))
    active = current()
    if not tgt.simulated and active is not None and active.target != tgt and getattr(active.routing, "overrides", None):
        # a real target's profile is read from the dispatcher once per process: not while the active
        # engine's kernels sit on it. The names are checked when the new session opens instead (after
        # the active one is suspended); a failure there resumes the active session as it was.
        return
    if cfg.force_cpu or cfg.deny or cfg.allow:  # unknown op names or codes fail here, before anything changes
        from .routing.policy import make_policy
        from .routing.profiles import profile_for

        make_policy(cfg, profile_for(tgt))


def _check_thread(call: str, tgt: Target, cfg: Config) -> None:
    """Other settings from a thread that did not install the active session: an error."""
    session = current()
    if session is None or session.same_as(tgt, cfg):
        return
    owner, me = session.owner, threading.current_thread()
    if owner is me or not owner.is_alive():
        return
    raise UsageError(format_error(
        call, f"the active session's settings (target {session.target.label!r}), or a call from the thread "
              f"that installed it ({owner.name!r})",
        f"target {tgt.label!r} with other settings, from thread {me.name!r}",
        why="the adapter's session is process-wide: switching it here would silently move the other thread's ops "
            "to these settings too",
        fix="use the same settings in every thread (adapted() then shares the session), or install once before "
            "starting the threads"))


def _open_new(tgt: Target, cfg: Config) -> AdapterSession:
    """Suspend the active session, open a new one; on failure resume the old one and raise.
    Returns the new session, active; the old one stays suspended (the caller closes or keeps it)."""
    previous = current()
    if previous is not None:
        previous._suspend()
        _state.set_current(None)
    session = AdapterSession(tgt, cfg)
    try:
        session._open()
    except BaseException:
        if previous is not None:
            previous._resume()
            _state.set_current(previous)
        raise
    _state.set_current(session)
    return session


def install(target: str | Target = "auto", *, simulate: bool = False, emulate: bool = False,
            **options: Any) -> AdapterSession:
    """Install the adapter: CUDA-written code now runs on ``target``.

    ``target`` is ``"auto"`` (the best present: cuda > npu > xpu > mps > cpu) or a name;
    ``simulate=True`` previews another backend's routing while executing on this machine;
    ``emulate=True`` executes it on an emulated device of the project's own (``npu``: a real
    PrivateUse1 device whose memory is host memory, torch_adapter/emulated). Options: ``amp_dtype`` ("auto" | "float16" | "bfloat16" | "float32"; or
    ``mixed_precision`` "fp16" | "bf16" | "fp32" | None), ``float16_compute`` ("auto" | "bfloat16" |
    "float32" | "float16"), ``dtype_policy`` ("auto" | "float16" | "float32"), ``fallback`` ("allow" | "warn" |
    "error"), ``force_cpu``, ``deny`` and ``allow`` (op names or reason codes such as ``"TA-F001"``:
    docs/reasons.md), ``max_fallbacks`` (how many distinct ops may fall back), ``propagate`` (adapt child processes too),
    ``communication_backend``, ``log_redirects``, the optimization layer (docs/tools.md):
    ``optimization_level`` ("conservative" | "balanced" | "aggressive"), ``fusion_patterns``,
    ``memory_strategy`` ("default" | "reuse" | "aggressive" | "low"), ``gradient_checkpointing``,
    ``activation_checkpointing``, ``communication_bucket_size``; ``device_count`` (what
    ``torch.cuda.device_count()`` answers where every CUDA index names the CPU); and for the tools
    ``debug_mode`` (False | True | "raise" | "warn" | "compare") and ``memory_server``.

    Installing again with the same settings returns the same session; with other settings
    the old session is closed (after the new one opened: a failing install leaves the old
    one working). ``uninstall()`` restores torch exactly.
    """
    with _LOCK:
        tgt, cfg = _prepare(target, simulate, options, "torch_adapter.install", emulate)
        previous = current()
        if previous is not None and previous.same_as(tgt, cfg):
            return previous
        _check_thread("torch_adapter.install()", tgt, cfg)
        session = _open_new(tgt, cfg)
        if previous is not None:  # replaced by install(): closed (an adapted() block it was made
            previous._close()      # for still resumes its outer session at its end)
        return session


def uninstall() -> None:
    """Remove every patch and hook; torch is as it was before install(). Safe to call twice.

    Closes the active session; sessions suspended by ``%adapter target`` switches are closed
    too, those an open ``adapted()`` block or comparison suspended are resumed when it ends."""
    with _LOCK:
        session = current()
        _state.set_current(None)
        try:
            if session is not None:
                session._close()
        finally:
            while _state.STACK and _state.STACK[-1][1] == "switch":
                _state.STACK.pop()[0]._close()


def _push(session: AdapterSession | None, why: str) -> None:
    if session is not None:
        _state.STACK.append((session, why))


def _resume(session: AdapterSession | None) -> None:
    """Close the session now active (the block's), then make ``session`` active again."""
    active = current()
    _state.set_current(None)
    try:
        if active is not None and active is not session:
            active._close()
    finally:
        if session is not None:
            _state.STACK[:] = [e for e in _state.STACK if e[0] is not session]
            if not session.closed:
                if session.suspended:
                    session._resume()
                _state.set_current(session)


@contextlib.contextmanager
def adapted(target: str | Target = "auto", *, simulate: bool = False, emulate: bool = False,
            **options: Any) -> Iterator[AdapterSession]:
    """``with adapted(target="cpu"):`` — installed inside the block, restored after.

    With a session installed before the block and other settings, that session is
    suspended for the block and resumed intact afterwards (its registrations, policy,
    options, logs; the same object). With the same settings the block shares it. Blocks on
    several threads may share one session; other settings from another thread raise.
    """
    with _LOCK:
        tgt, cfg = _prepare(target, simulate, options, "torch_adapter.adapted", emulate)
        outer = current()
        if outer is not None and outer.same_as(tgt, cfg):
            session = outer
        else:
            _check_thread("torch_adapter.adapted()", tgt, cfg)
            _push(outer, "block")
            try:
                session = _open_new(tgt, cfg)
            except BaseException:
                _state.STACK[:] = [e for e in _state.STACK if e[0] is not outer]
                raise
            session._outer = [outer]
        session._blocks += 1
    try:
        yield session
    finally:
        with _LOCK:
            session._blocks -= 1
            if session._blocks == 0 and session._outer:  # the last block out resumes the outer one
                (outer,), session._outer = session._outer, []
                _resume(outer)


@contextlib.contextmanager
def suspended() -> Iterator[AdapterSession | None]:
    """Suspend the active session for the block (yielded; None if none); whatever the block
    installs is closed at its end and the session resumed intact. ``%%adapter_compare`` uses it."""
    with _LOCK:
        outer = current()
        if outer is not None:
            outer._suspend()
            _state.set_current(None)
            _push(outer, "block")
    try:
        yield outer
    finally:
        with _LOCK:
            _resume(outer)


def switch(target: str | Target = "auto", *, simulate: bool = False, emulate: bool = False) -> AdapterSession:
    """``%adapter target NAME``: make ``target`` the active one, keeping the session's options.

    The session active before is suspended, not closed; switching back to its target
    resumes it intact (registrations and policy included). ``uninstall()`` closes them all."""
    with _LOCK:
        active = current()
        options = active.config.as_dict() if active is not None else {}
        tgt, cfg = _prepare(target, simulate, options, "torch_adapter.switch", emulate)
        if active is not None and active.target == tgt:
            return active
        back = next((s for s, why in reversed(_state.STACK) if why == "switch" and s.target == tgt), None)
        if back is not None:
            _resume(back)
            return back
        _check_thread("%adapter target", tgt, cfg)
        _push(active, "switch")
        try:
            return _open_new(tgt, cfg)
        except BaseException:
            _state.STACK[:] = [e for e in _state.STACK if e[0] is not active]
            raise


def configure(**options: Any) -> Config:
    """Change the installed session's settings at once (scoped to that session).

    Accepts the same options as :func:`install`. Routing options (``fallback``,
    ``force_cpu``, ``deny``) take effect for the next op; ``debug_mode`` and
    ``memory_server`` at once; the optimization layer's for the models and optimizers the
    script uses next (docs/tools.md). Every value is checked first: an invalid one raises
    UsageError listing the valid ones and the session stays as it was.
    """
    with _LOCK:
        session = current()
        if session is None:
            raise UsageError(format_error(
                "torch_adapter.configure()", "an installed adapter", "none installed",
                fix="call torch_adapter.install() first, or use install(..., fallback=...)"))
        cfg = make_config(options, base=session.config)
        _check_policy(session.target, cfg)
        _check_thread("torch_adapter.configure()", session.target, cfg)
        old = session.config
        had_routing = session.routing is not None
        try:
            _reconfigure(session, old, cfg)
        except BaseException as exc:  # atomic: the session goes back to exactly its old settings
            for undo in _rollback(session, cfg, old, had_routing):
                exc.add_note(f"torch_adapter: putting the old settings back also failed: {undo}")
            raise
        return session.config


def _reconfigure(session: AdapterSession, old: Config, cfg: Config) -> None:
    """Apply ``cfg`` to the installed ``session`` whose settings were ``old``."""
    from .tools.session_tools import apply as apply_tools

    session.config = cfg
    session._apply_low_precision()
    if session._enforces(cfg):
        session._attach_routing()
    if session.routing is not None:
        session.routing.reconfigure(cfg)
    apply_tools(session, old)
    session._apply_optimizations(old)


def _rollback(session: AdapterSession, new: Config, old: Config, had_routing: bool) -> list[BaseException]:
    """Every part of a failed :func:`configure` back to ``old``, each step tried; the failures."""
    from .tools.session_tools import apply as apply_tools

    session.config = old
    failures: list[BaseException] = []

    def routing() -> None:
        if not had_routing and session.routing is not None:
            engine, session.routing = session.routing, None
            engine.detach()
        elif session.routing is not None:
            session.routing.reconfigure(old)

    for step in (routing, session._apply_low_precision, lambda: apply_tools(session, new),
                 lambda: session._apply_optimizations(new)):
        try:
            step()
        except BaseException as exc:
            failures.append(exc)
    return failures
