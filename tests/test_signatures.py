"""Every stand-in accepts the same parameters as the torch function it stands for.

A popular vision library calls ``torch.cuda.stream(stream=s)`` by keyword; a stand-in that
names its parameter ``s`` breaks it. Rules, checked for every patch an install makes:

- a stand-in that *replaces* a Python function declares the original's parameters exactly
  (names, kinds, defaults; annotations aside);
- a wrapper that *forwards* to the original (``functools.wraps``: ``__wrapped__`` is the
  original) declares a prefix of the original's parameters and passes the rest on with
  ``*args``/``**kwargs``, so torch itself accepts or rejects them;
- a stand-in for a C function (no Python signature) either forwards ``(*args, **kwargs)``
  verbatim, or is listed in :data:`C_CALLS`, where keyword calls that torch's own argument
  parser accepts (it raises no TypeError for them) must be accepted by the stand-in too.

Also: every patch target is the object torch itself looks the name up on (a module by its
import path, or a class reachable from its module), and every ``torch.cuda`` stand-in takes
a call with all of the original's parameters passed by keyword.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import pytest
import torch
import torch.nn as nn

import torch_adapter
from torch_adapter.redirect import cuda_bindings
from torch_adapter.errors import UnsupportedCudaFeature
from torch_adapter.redirect.cuda_table import TABLE, U


def _signature(fn: Any, follow: bool = True) -> inspect.Signature | None:
    try:
        return inspect.signature(fn, follow_wrapped=follow)
    except (TypeError, ValueError):
        return None


def _shape(sig: inspect.Signature, method: bool) -> list[tuple[str, str, str | None]]:
    params = list(sig.parameters.values())
    if method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return [(p.name, p.kind.name, None if p.default is p.empty else repr(p.default)) for p in params]


_POSITIONAL = {"POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL"}
_KEYWORD = {"POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY", "VAR_KEYWORD"}


def _forwards_rest(own: list, orig: list) -> bool:
    """``own`` is a prefix of ``orig`` followed by *args/**kwargs that can carry the rest."""
    var = [p for p in own if p[1] in ("VAR_POSITIONAL", "VAR_KEYWORD")]
    named = [p for p in own if p not in var]
    if own[:len(named)] != named or orig[:len(named)] != named:
        return False
    rest = {kind for _, kind, _ in orig[len(named):]}
    kinds = {kind for _, kind, _ in var}
    return (not rest & _POSITIONAL or "VAR_POSITIONAL" in kinds) and (not rest & _KEYWORD or "VAR_KEYWORD" in kinds)


def _patches(session) -> list[tuple[Any, str, Any, Any]]:
    return [(owner, name, orig, getattr(owner, name)) for owner, name, _, orig in session.patcher._saved.values()]


def _label(owner: Any, name: str) -> str:
    return f"{getattr(owner, '__qualname__', None) or getattr(owner, '__name__', owner)}.{name}"


# C functions whose stand-in cannot forward (it must not reach CUDA code): keyword calls that
# torch's argument parser takes (names from torch's own error messages and docs).
def _c_calls() -> dict[str, list[tuple[tuple, dict]]]:
    t = torch.ones(2)
    return {
        "Tensor.cuda": [((t,), {"device": None, "non_blocking": False, "memory_format": torch.preserve_format}),
                        ((t, 0), {})],
        "Tensor.pin_memory": [((t,), {})],
        "Tensor.half": [((t,), {"memory_format": torch.preserve_format}), ((t,), {})],
        "Tensor.is_pinned": [((t,), {})],
        "Tensor.type": [((t,), {"dtype": "torch.DoubleTensor", "non_blocking": False}), ((t,), {})],
        "Tensor.record_stream": [((t,), {"s": torch.cuda.current_stream()})],  # the stand-in's stream
        "torch.Generator": [((), {"device": "cpu"}), (("cpu",), {})],
        "torch.is_autocast_enabled": [((), {"device_type": "cpu"}), ((), {})],
        "torch.get_autocast_dtype": [((), {"device_type": "cpu"})],
        "torch.get_autocast_gpu_dtype": [((), {})],
    }


def _is_pure_forwarder(sig: inspect.Signature | None, method: bool) -> bool:
    return sig is not None and all(kind in ("VAR_POSITIONAL", "VAR_KEYWORD") for _, kind, _ in _shape(sig, method))


def test_every_stand_in_accepts_the_originals_parameters():
    # float16 as asked on every CPU kind: the answers are compared with torch's (tests/test_dtype_policy.py
    # has what float16 requests give where the policy maps them)
    session = torch_adapter.install("cpu", dtype_policy="float16")
    problems, c_stand_ins = [], {}
    for owner, name, orig, new in _patches(session):
        if not callable(orig) or orig is new:
            continue
        method = isinstance(owner, type) and not isinstance(new, type)
        label = _label(owner, name)
        expected = _signature(orig)
        if expected is None:  # a C function or class
            if not _is_pure_forwarder(_signature(new, follow=False), method):
                c_stand_ins[label] = new
            continue
        if getattr(new, "__wrapped__", None) is orig:
            own = _signature(new, follow=False)
            if own is None or not _forwards_rest(_shape(own, method), _shape(expected, method)):
                problems.append(f"{label}: forwards with {own}, original takes {expected}")
            continue
        got = _signature(new)
        if got is None or _shape(got, method) != _shape(expected, method):
            problems.append(f"{label}: takes {got}, original takes {expected}")
    assert not problems, "\n".join(problems)

    calls = _c_calls()
    unlisted = sorted(set(c_stand_ins) - set(calls))
    assert not unlisted, f"stand-ins of C functions with no keyword-call check: {unlisted}"
    for label, stand_in in c_stand_ins.items():
        original = session.patcher.original(*_owner_and_name(label))
        for args, kwargs in calls[label]:
            ran, want = _accepts(original, args, kwargs, f"torch's {label}")
            got = stand_in(*args, **kwargs)  # on the CPU target it runs: no exception at all
            if label in ANSWERS_DIFFER:
                continue
            if not ran:  # torch's needs CUDA: the stand-in's CPU answer
                want = NO_CUDA_ANSWERS[label](*args)
            _same(got, want, f"the stand-in for {label}{kwargs}")
        with pytest.raises(TypeError):  # a name torch does not take is refused, as by torch
            stand_in(*calls[label][0][0], __not_a_parameter__=1)
            pytest.fail(f"the stand-in for {label} took an unknown keyword")


# The stand-in's answer where torch's own call needs CUDA (the CPU target's promise).
NO_CUDA_ANSWERS = {
    "Tensor.cuda": lambda t, *_: t, "Tensor.pin_memory": lambda t, *_: t, "Tensor.record_stream": lambda *_: None,
}
# Stand-ins whose answer is not torch's, by design or known (with why).
ANSWERS_DIFFER: dict[str, str] = {}  # none today (torch.get_autocast_gpu_dtype answered CPU's bfloat16 before)


def _same(got: Any, want: Any, who: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and (got.dtype, got.device) == (want.dtype, want.device) and \
            torch.equal(got, want), f"{who} returned {got!r}, torch's answer is {want!r}"
    elif isinstance(want, torch.Generator):
        assert isinstance(got, torch.Generator) and got.device == want.device, f"{who} returned {got!r}"
    else:
        assert type(got) is type(want) and got == want, f"{who} returned {got!r}, torch's answer is {want!r}"


def _owner_and_name(label: str) -> tuple[Any, str]:
    owner, _, name = label.rpartition(".")
    return {"Tensor": torch.Tensor, "torch": torch}[owner], name


def _accepts(fn: Any, args: tuple, kwargs: dict, who: str) -> tuple[bool, Any]:
    """(ran, result) of torch's own call: it must take the parameters; it may need CUDA to run."""
    try:
        return True, fn(*args, **kwargs)
    except TypeError as exc:
        raise AssertionError(f"{who} rejects {args[1:] if args else ()} {kwargs}: {exc}") from exc
    except Exception:  # noqa: BLE001 - accepted the parameters; cannot run without CUDA here
        return False, None


def test_every_patch_target_is_the_object_torch_looks_the_name_up_on():
    session = torch_adapter.install("cpu")
    wrong = []
    for owner, name, orig, _ in _patches(session):
        if isinstance(owner, types.ModuleType):
            if sys.modules.get(owner.__name__) is not owner:
                wrong.append(f"{_label(owner, name)}: module not registered under its import path")
        elif isinstance(owner, type):
            home = sys.modules.get(owner.__module__)
            obj = home
            for part in owner.__qualname__.split("."):
                obj = getattr(obj, part, None)
            if obj is not owner and getattr(torch, owner.__name__, None) is not owner:
                wrong.append(f"{_label(owner, name)}: class not reachable from {owner.__module__}")
        else:
            wrong.append(f"{_label(owner, name)}: patched on a {type(owner).__name__}, not a module or class")
        # the private torch._C._cuda_* bindings a CUDA build has and a CPU build lacks are set on
        # purpose (redirect/cuda_bindings.py): CUDA-written code looks them up on torch._C
        cuda_build_binding = owner is torch._C and name in cuda_bindings.BINDINGS
        if orig is torch_adapter.core.patching.MISSING and not cuda_build_binding:
            wrong.append(f"{_label(owner, name)}: the name did not exist there (torch never looks it up)")
    assert not wrong, "\n".join(wrong)


# --- keyword calls of every torch.cuda stand-in -----------------------------------------------
def _value_for(name: str) -> Any:
    values = {
        "device": 0, "peer_device": 0, "stream": torch.cuda.current_stream(), "seed": 0, "res": 0,
        "new_state": torch.cuda.get_rng_state(), "new_states": [torch.cuda.get_rng_state()],
        "debug_mode": 0, "fraction": 0.5, "callables": nn.Linear(2, 2), "sample_args": (torch.ones(1, 2),),
        "obj": torch.ones(1), "msg": "range", "range_id": 0, "enabled": True, "value": True,
    }
    if name == "cuda_graph":  # torch.cuda.graph's graph (the emulated CUDAGraph while installed)
        return torch.cuda.CUDAGraph()
    return values.get(name, None)


def _stand_in_names() -> list[str]:
    return sorted(n for n in TABLE if n in torch.cuda.__all__)


@pytest.mark.parametrize("name", _stand_in_names())
def test_torch_cuda_stand_in_takes_every_parameter_by_keyword(name):
    original = getattr(torch.cuda, name)
    sig = _signature(original)
    torch_adapter.install("cpu")
    stand_in = getattr(torch.cuda, name)
    if stand_in is original or not callable(stand_in) or sig is None or isinstance(stand_in, types.ModuleType):
        pytest.skip(f"torch.cuda.{name} is unchanged, a value, a module or has no Python signature")
    kwargs = {p.name: (p.default if p.default is not p.empty else _value_for(p.name))
              for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if TABLE[name][0] == U:
        with pytest.raises(UnsupportedCudaFeature):
            stand_in(**kwargs)
        return
    result = stand_in(**kwargs)
    if hasattr(result, "__enter__") and not isinstance(result, torch.Tensor):
        with result:
            pass


def test_stream_by_keyword_as_a_data_prefetcher_calls_it():
    torch_adapter.install("cpu")
    s = torch.cuda.Stream()
    with torch.cuda.stream(stream=s):
        x = torch.ones(2).cuda(non_blocking=True)
    torch.cuda.current_stream().wait_stream(s)
    x.record_stream(torch.cuda.current_stream())
    assert x.device.type == "cpu"


# Names torch's own modules bind from a patched module (``from torch import load``), checked
# for each patched function: such a copy is patched too, or listed here with why it need not be.
ALIAS_OK = {
    "torch._C": "the C bindings themselves (torch.* is their public face)",
    "torch._C._fft": "the C bindings themselves",
    "torch.utils.data.dataset.Generator": "annotations and the default generator",
    "torch.utils.data.dataset.randperm": "random_split passes no device (a default device still applies)",
    "torch._utils._get_available_device_type": "its own definition; DataParallel looks it up in its module",
    "torch.distributed.checkpoint.filesystem._get_available_device_type": "asks for the machine's real device",
    "torch.cuda.green_contexts.GreenContext": "the class's home; torch.cuda.GreenContext is what code uses",
    "torch.cuda.profiler.check_error": "used only by torch.cuda.profiler.start/stop/profile, patched",
    "torch.cuda.profiler.cudart": "used only by torch.cuda.profiler.start/stop/profile, patched",
    "torch.import_ir_module": "torch.jit.load calls torch._C.import_ir_module (patched)",
    "torch.import_ir_module_from_buffer": "torch.jit.load calls torch._C.import_ir_module_from_buffer (patched)",
    "torch.jit._script.script": "its definition; torch calls torch.jit.script (and torch.jit._trace.script, patched)",
    "torch.jit._trace.trace": "its definition; torch and users call torch.jit.trace",
    "torch.jit._serialization.load": "its definition; torch and users call torch.jit.load",
}


def test_torch_modules_that_bind_a_patched_name_see_the_patch():
    import importlib

    for name in ("torch.nn.parallel.data_parallel", "torch.utils.data", "torch.distributed.device_mesh",
                 "torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed.checkpoint",
                 "torch.serialization", "torch.amp", "torch.cuda.amp", "torch.nested", "torch.fft"):
        importlib.import_module(name)
    session = torch_adapter.install("cpu")
    # torch.device is left out: dozens of torch modules bind it (``from torch import device as
    # _device``) for annotations and isinstance checks, which the C type answers the same.
    patched = {id(orig): (owner.__name__, name) for owner, name, orig, _ in _patches(session)
               if callable(orig) and isinstance(owner, types.ModuleType) and (owner, name) != (torch, "device")}
    missed = []
    for modname, mod in sorted(sys.modules.items()):
        if not modname.startswith("torch") or modname.startswith("torch_adapter") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            where = patched.get(id(value))
            if where is not None and where != (modname, attr) and f"{modname}.{attr}" not in ALIAS_OK \
                    and modname not in ALIAS_OK:
                missed.append(f"{modname}.{attr} still holds the original of {where[0]}.{where[1]}")
    assert not missed, "\n".join(missed)
