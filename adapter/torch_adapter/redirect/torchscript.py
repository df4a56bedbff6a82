"""TorchScript under the adapter: torch's builtins seen through the wrappers, and CUDA device
constants inside compiled graphs → the target.

**Builtins by identity.** TorchScript emits an aten op for a Python object whose ``id`` is in
``torch.jit._builtins``' table (``id(torch.zeros) -> "aten::zeros"``, filled when torch is
imported) and compiles the *source* of any other function. The adapter's wrappers of
``torch.zeros`` & co. are not in it, so scripting code that calls a factory failed ("module,
class, method, function ... expected, got builtin_function_or_method") — and with it every
torch module that scripts such code at import (``torch.distributed.optim``'s functional
optimizers, the modules forward-mode AD imports). While installed, every patched-in object whose
original is in the table is registered under the original's op name (:meth:`Patcher.set_item`:
removed at uninstall, the table is then exactly as before). Compiled graphs hold aten ops, not
Python objects: a function scripted during a session works after it, one scripted before works
during it. The registration is synced again at every ``torch.jit.script`` (patches made later).

**Device constants.** Scripted code that names ``device="cuda"``, ``x.to("cuda")`` or
``x.cuda()`` calls aten directly, past every Python entry point: TorchScript folds the device
into a ``prim::Constant`` of type Device. A graph pass replaces those naming ``cuda``/``cuda:N``
(and string constants only used by ``aten::device``) with the target's device and ``aten::cuda``
with ``aten::to(target)``; each is logged (kind ``jit``). It runs on what ``torch.jit.script`` /
``torch.jit.trace`` return, on what ``torch.jit.load`` loads (the archive's functions too),
on a ScriptModule moved with ``.cuda()`` / ``.to("cuda" | int)``, and at install on every
function already in TorchScript's global compilation unit.

**Permanent, by torch's design.** A graph's executor is built from the graph at its first call
and never re-read (``_debug_flush_compilation_cache`` does not re-read it either: measured,
torch 2.13). So a rewrite only takes effect if it comes before the first call, and it cannot be
undone for code that ran: a graph compiled, loaded or moved while installed keeps the target's
device after ``uninstall()`` (as a module moved with ``.cuda()`` keeps its parameters there).
A function that already *ran* before install keeps its executor (and its ``cuda``); a module
scripted before install is rewritten when it is moved (``.cuda()`` / ``.to``), not otherwise.

``torch.jit.load(map_location=...)``: ``"cuda"``, ``"cuda:N"``, ``torch.device("cuda")`` and an
int ordinal (torch itself rejects an int here) → the target; with no ``map_location`` an archive
whose tensors were saved on CUDA is loaded again onto the target.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import types
from typing import Any, Iterable

import torch

from ..core import torch_private as tp
from .devices import _index_of

__all__ = ["apply", "GraphRewriter"]


def apply(session: Any) -> None:
    """Register the wrappers as builtins and patch script/trace/load/ScriptModule moves."""
    if session.target.device_type == "cuda":
        return
    table = tp.jit_builtin_table()
    if table is None:  # a torch without the table: TorchScript is left as it is
        return
    p = session.patcher
    rewriter = GraphRewriter(session.device_mapper, session.redirect_log)
    register_builtins(p, table)
    rewriter.functions(tp.jit_global_functions())  # compiled before install, not run yet
    _patch_compilers(p, table, rewriter)
    _patch_load(p, rewriter)
    _patch_module_moves(p, rewriter)


def register_builtins(p: Any, table: dict[int, str]) -> int:
    """Each patched-in object whose original TorchScript knows as a builtin, under the same op
    name, restorably. Returns how many were added now."""
    added = 0
    for _owner, _name, original, value in p.patches():
        op = table.get(id(original))
        if op is not None and table.get(id(value)) != op:
            p.set_item(table, id(value), op)
            added += 1
    return added


class GraphRewriter:
    """The device-constant pass over TorchScript graphs (module docstring)."""

    def __init__(self, mapper: Any, log: Any) -> None:
        self.mapper = mapper
        self.log = log
        self._seen: set[str] = set()  # global functions already passed over (by qualified name)

    # -- what to pass over ---------------------------------------------------------------
    def compiled(self, obj: Any) -> None:
        """What torch.jit.script/trace returned, and any function compiled with it."""
        if isinstance(obj, torch.jit.ScriptModule):
            self.module(obj)
        elif isinstance(obj, torch.jit.ScriptFunction):
            self.function(obj)
        self.functions(tp.jit_global_functions())

    def functions(self, fns: Iterable[Any], *, global_unit: bool = True) -> None:
        """Pass over ``fns``; those of the global compilation unit once each (names are unique
        there, not across units: an archive's ``__torch__.f`` is another function)."""
        for fn in fns:
            name = fn.qualified_name
            if not global_unit:
                self.function(fn)
            elif name not in self._seen:
                self._seen.add(name)
                self.function(fn)

    def function(self, fn: Any) -> None:
        self.graph(fn.graph, fn.qualified_name)

    def module(self, module: Any) -> None:
        for where, graph in tp.script_module_graphs(module):
            self.graph(graph, where)

    # -- the pass ------------------------------------------------------------------------
    def graph(self, graph: Any, where: str) -> int:
        """Rewrite ``graph`` in place; returns the number of rewrites."""
        count = 0
        for node in graph.findAllNodes("prim::Constant", True):
            if not node.hasAttribute("value") or node.kindOf("value") != "s":
                continue
            value = node.s("value")
            if not value.startswith("cuda"):
                continue
            kind = node.output().type().kind()
            if kind == "DeviceObjType" or (kind == "StringType" and _only_device_uses(node)):
                new = str(self._target(value))
                node.s_("value", new)
                self._record(where, repr(value), new)
                count += 1
        calls = graph.findAllNodes("aten::cuda", True)
        for node in calls:
            self._replace_cuda_call(graph, node)
            self._record(where, ".cuda()", f"to({str(self.mapper.device(None))!r})")
            count += 1
        if calls:
            tp.jit_dead_code_elimination(graph)  # the unused constants schema matching left behind
        return count

    def _target(self, spec: str) -> torch.device:
        return self.mapper.device(_index_of(spec))

    def _replace_cuda_call(self, graph: Any, node: Any) -> None:
        with graph.insert_point_guard(node):
            dev = graph.insertConstant(self.mapper.device(None))
            new = graph.insert("aten::to", [node.inputsAt(0), dev])
        node.output().replaceAllUsesWith(new)
        node.destroy()

    def _record(self, where: str, asked: str, became: str) -> None:
        if self.log.enabled:
            self.log.record("jit", f"TorchScript {where}: device {asked}", became, depth=5)


def _only_device_uses(node: Any) -> bool:
    uses = node.output().uses()
    return bool(uses) and all(u.user.kind() == "aten::device" for u in uses)


def _compiled_from_source(owner: Any, name: str, original: Any) -> bool:
    """A patch of a torch module's Python function: TorchScript compiles such a function from its
    source when scripted code calls it (torch.optim's ``_get_capturable_supported_devices`` from the
    functional optimizers), so while it compiles the function is torch's own, not the adapter's
    closure (which it cannot compile: "python value of type 'str' cannot be used as a value")."""
    return (isinstance(owner, types.ModuleType) and isinstance(original, types.FunctionType)
            and owner.__name__.startswith("torch"))


def _patch_compilers(p: Any, table: dict[int, str], rewriter: GraphRewriter) -> None:
    orig_script, orig_trace = torch.jit.script, torch.jit.trace

    @functools.wraps(orig_script)
    def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
        register_builtins(p, table)  # patches made since install
        # a scripted class's names are resolved in its caller's frame, counted from torch's
        # script(): one more frame up, this one
        if len(args) >= 2:
            args = (args[0], args[1] + 1, *args[2:])
        else:
            kwargs["_frames_up"] = kwargs.get("_frames_up", 0) + 1
        with p.suspended(only=_compiled_from_source):  # torch's own Python functions, never a wrapper of one
            out = orig_script(obj, *args, **kwargs)
        rewriter.compiled(out)
        return out

    @functools.wraps(orig_trace)
    def trace(func: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_trace(func, *args, **kwargs)
        rewriter.compiled(out)
        return out

    p.set(torch.jit, "script", script)
    p.set(sys.modules["torch.jit._trace"], "script", script)  # script_if_tracing compiles through it
    p.set(torch.jit, "trace", trace)


def _patch_load(p: Any, rewriter: GraphRewriter) -> None:
    """``torch.jit.load``: map_location → the target; the archive's graphs passed over."""
    mapper, log = rewriter.mapper, rewriter.log
    owner, names = tp.jit_importers()
    for name in names:  # what jit.load calls with the archive's own compilation unit
        def make(orig: Any) -> Any:
            @functools.wraps(orig)
            def importer(*args: Any, **kwargs: Any) -> Any:  # (cu, file or bytes, map_location, ...)
                module = orig(*args, **kwargs)
                cu = args[0] if args else kwargs.get("cu")
                if hasattr(cu, "get_functions"):
                    rewriter.functions(cu.get_functions(), global_unit=False)
                return module

            return importer

        p.set(owner, name, make(getattr(owner, name)))

    orig_load = torch.jit.load

    @functools.wraps(orig_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if map_location is not None:
            if type(map_location) is int or mapper.is_cuda(map_location):
                map_location = mapper.map(map_location, f"torch.jit.load(map_location={map_location!r})", ints=True)
            module = orig_load(f, map_location, *args, **kwargs)
        else:
            module = _load_saved_on_cuda(orig_load, f, mapper, log, args, kwargs)
        rewriter.module(module)
        return module

    p.set(torch.jit, "load", load)


def _load_saved_on_cuda(orig_load: Any, f: Any, mapper: Any, log: Any, args: tuple, kwargs: dict) -> Any:
    """No map_location: torch restores each tensor on the device it was saved from; an archive
    saved on CUDA is loaded again with the target as map_location."""
    start = f.tell() if isinstance(f, io.IOBase) and f.seekable() else None
    try:
        return orig_load(f, None, *args, **kwargs)
    except RuntimeError as exc:
        again = start is not None or isinstance(f, (str, os.PathLike))
        if "cuda" not in str(exc).lower() or not again:
            raise
    if start is not None:
        f.seek(start)
    new = mapper.device(None)
    log.record("device", "torch.jit.load() of an archive saved on CUDA", f"map_location={str(new)!r}", depth=4)
    return orig_load(f, new, *args, **kwargs)


def _patch_module_moves(p: Any, rewriter: GraphRewriter) -> None:
    """``ScriptModule.cuda()`` / ``.to("cuda" | int)``: parameters move through the device patches
    (Module.to, Tensor.cuda); the module's graphs are passed over too."""
    mapper = rewriter.mapper

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        dev = args[0] if args else kwargs.get("device")
        out = torch.nn.Module.to(self, *args, **kwargs)
        if type(dev) is int or mapper.is_cuda(dev):
            rewriter.module(self)
        return out

    def cuda(self: Any, device: Any = None) -> Any:
        out = torch.nn.Module.cuda(self, device)
        rewriter.module(self)
        return out

    to.__doc__, cuda.__doc__ = torch.nn.Module.to.__doc__, torch.nn.Module.cuda.__doc__
    p.set(torch.jit.ScriptModule, "to", to)
    p.set(torch.jit.ScriptModule, "cuda", cuda)
