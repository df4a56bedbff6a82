"""The exceptions torch_adapter raises, drawn once.

::

    AdapterError (Exception)            everything below; catch this to catch all
    ├── UsageError (+ ValueError)       a call with bad arguments (unknown option, bad value)
    │   └── RegistrationError           a duplicate or invalid register_* call
    ├── TargetError (+ RuntimeError)    a target that is unknown or not on this machine
    ├── UnsupportedCudaFeature (+ RuntimeError)
    │                                   a CUDA-only feature the target cannot provide
    │                                   (cudart, jiterator, raw CUDA graph handles, ...)
    ├── redirect.cuda_graphs.GraphCaptureError (+ torch.AcceleratorError)
    │                                   an emulated CUDA graph capture met what CUDA refuses
    │                                   too (host sync, data-dependent shape); defined there
    │                                   because it derives from a torch class
    ├── ProfileError (+ ValueError)     a capability profile file that is malformed
    ├── FallbackError (+ RuntimeError)  fallback policy "error" met an op the target lacks
    ├── UnsupportedDtypeError           a simulated target met a dtype its real backend refuses;
    │   ├── UnsupportedDtypeTypeError (+ TypeError)        as MPS raises it
    │   └── UnsupportedDtypeRuntimeError (+ RuntimeError)  as XPU (no fp64) raises it
    ├── CheckError (+ RuntimeError)     the `check` command cannot read its input
    ├── RestoreError (+ RuntimeError)   undoing a session failed somewhere (everything else
    │                                   was still put back); names every failure
    └── NumericsError (+ FloatingPointError)
                                        a debug check found a NaN/Inf or a CPU mismatch
                                        (torch_adapter.debug); names op, route, module, line

Every message has five parts: the call, what was expected, what was given, why, and
the fix. :func:`format_error` assembles them so that all messages read alike.
"""

from __future__ import annotations

from typing import Iterable

__all__ = [
    "AdapterError",
    "UsageError",
    "TargetError",
    "UnsupportedCudaFeature",
    "ProfileError",
    "RegistrationError",
    "FallbackError",
    "UnsupportedDtypeError",
    "UnsupportedDtypeTypeError",
    "UnsupportedDtypeRuntimeError",
    "CheckError",
    "RestoreError",
    "NumericsError",
    "format_error",
    "did_you_mean",
    "setting",
]


class AdapterError(Exception):
    """Base of every error torch_adapter raises."""


class UsageError(AdapterError, ValueError):
    """A torch_adapter call got arguments it cannot use."""


class TargetError(AdapterError, RuntimeError):
    """A target that is unknown, or not present on this machine."""


class RestoreError(AdapterError, RuntimeError):
    """Some part of a session could not be undone; every other part was.

    ``failures`` lists ``(what, exception)``; the first exception is the ``__cause__``."""

    def __init__(self, failures: list) -> None:
        self.failures = list(failures)
        lines = "; ".join(f"{what}: {type(exc).__name__}: {exc}" for what, exc in self.failures)
        super().__init__(format_error(
            "torch_adapter: undoing the session's patches", "every patch and hook put back",
            f"{len(self.failures)} failed ({lines})",
            why="each failure was caught so that everything else could still be restored",
            fix="the failures above name the part; report it if it is the adapter's own"))
        if self.failures:
            self.__cause__ = self.failures[0][1]


class UnsupportedCudaFeature(AdapterError, RuntimeError):
    """A CUDA-only feature that the target cannot provide."""


class ProfileError(AdapterError, ValueError):
    """A capability profile (TOML) that cannot be used."""


class RegistrationError(UsageError):
    """A register_fallback / register_accelerated / optimize.register call that is invalid
    (a usage error: catching UsageError catches it too)."""


class FallbackError(AdapterError, RuntimeError):
    """The fallback policy is "error" and an op would run on the CPU."""


class UnsupportedDtypeError(AdapterError):
    """A simulated target met a dtype its real backend refuses (routing/dtype_check.py). Raised
    as one of the two subclasses, so that it is the exception class the real backend raises."""


class UnsupportedDtypeTypeError(UnsupportedDtypeError, TypeError):
    """A dtype refused as MPS refuses it (``TORCH_CHECK_TYPE``: a TypeError)."""


class UnsupportedDtypeRuntimeError(UnsupportedDtypeError, RuntimeError):
    """A dtype refused as an XPU without fp64 refuses it (SYCL: a RuntimeError)."""


class CheckError(AdapterError, RuntimeError):
    """`torch-adapter check` could not read or write what it was given."""


class NumericsError(AdapterError, FloatingPointError):
    """A ``torch_adapter.debug`` check failed: an op produced NaN/Inf, or its result differs
    from the CPU's. ``finding`` holds the details (op, route, module path, user site)."""

    def __init__(self, message: str, finding: object = None) -> None:
        super().__init__(message)
        self.finding = finding


def format_error(call: str, expected: str, got: str, why: str = "", fix: str = "") -> str:
    """One message in the house style: call, expected, got, why, fix."""
    parts = [f"{call}: expected {expected}, got {got}."]
    if why:
        parts.append(f"Why: {why}")
    if fix:
        parts.append(f"Fix: {fix}")
    return "\n".join(parts)


def did_you_mean(got: object, choices: "Iterable[str]", n: int = 3) -> str:
    """``" (did you mean 'warn'?)"`` for the choices closest to ``got``, or ``""``."""
    import difflib

    if not isinstance(got, str):
        return ""
    choices = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(got, choices, n=n, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[c] for c in difflib.get_close_matches(got.lower(), list(lowered), n=n, cutoff=0.6)]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


# How each setting is changed where the user is: a magic in a notebook, a flag of
# `torch-adapter run`, an option in Python (core.callsite.running_as says which).
_MAGICS = {"fallback": "%adapter policy {value}"}
_FLAGS = {"fallback": "--fallback {value}", "amp_dtype": "--amp-dtype {value}"}


def setting(option: str, value: str, where: str) -> str:
    """The way to set ``option`` to ``value`` for a user ``where`` ("notebook", "cli", "python"):
    ``%adapter policy warn``, ``torch-adapter run --fallback warn ...``, or
    ``torch_adapter.configure(fallback='warn')``."""
    if where == "notebook" and option in _MAGICS:
        return f"`{_MAGICS[option].format(value=value)}` in a cell"
    if where == "cli" and option in _FLAGS:
        return f"`torch-adapter run {_FLAGS[option].format(value=value)} ...`"
    return f"`torch_adapter.configure({option}={value!r})`"


def target_choice(name: str, where: str, *, simulate: bool = False, emulate: bool = False) -> str:
    """How a user ``where`` ("notebook", "cli", "python") picks target ``name`` (previewed with
    ``simulate``, on the emulated device with ``emulate``): ``torch-adapter run --target mps
    --simulate SCRIPT``, ``%adapter target mps --simulate``, ``install(target='mps', simulate=True)``."""
    flag = " --simulate" if simulate else " --emulate" if emulate else ""
    if where == "cli":
        return f"`torch-adapter run --target {name}{flag} SCRIPT`"
    if where == "notebook":
        return f"`%adapter target {name}{flag}` in a cell"
    kw = ", simulate=True" if simulate else ", emulate=True" if emulate else ""
    return f"`torch_adapter.install(target={name!r}{kw})`"


def target_call(name: str, where: str) -> str:
    """What the user called, in their words (the first part of a target error)."""
    return {"cli": f"torch-adapter run --target {name}", "notebook": f"%adapter target {name}"}.get(
        where, f"torch_adapter.install(target={name!r})")
