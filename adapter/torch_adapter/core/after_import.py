"""Run a function once a module is loaded — the one import hook of the adapter.

``after_import(patcher, name, fn)``: ``fn(module)`` now if ``name`` is already imported, else
right after it first executes (a meta-path finder). The finder belongs to the session's
:class:`~torch_adapter.core.patching.Patcher`: it is removed when the patcher restores, that is
when the session is *suspended* or closed, and put back (exactly one) when a resumed session
applies its patches again. So a suspended session's hooks never fire, and nested sessions
never stack finders. The module itself is not changed; the function sees it complete.

``around`` (a context manager factory) is entered around the module's first execution and the
function, for a module that builds tables from torch's attributes as it executes
(:mod:`.redirect.compiling`: torch._dynamo, imported with the patches suspended).

Used by :mod:`.redirect.probes` (third-party probes patched in modules imported later),
:mod:`.redirect.dtensor_rules` (rules registered once DTensor loads) and :mod:`.redirect.compiling`.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from typing import Any, Callable, ContextManager

__all__ = ["after_import", "finders"]


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn: Callable[[Any], None],
                 around: Callable[[], ContextManager[Any]] | None = None) -> None:
        self.name, self.fn, self.live, self.around = name, fn, True, around

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or not self.live:
            return None
        # Every live finder for this name is served by the first one reached; the others (and
        # every other _Finder) are skipped here, or each would search through the other forever.
        waiting = [f for f in sys.meta_path if isinstance(f, _Finder) and f.live and f.name == fullname]
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, waiting)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, finders: list[_Finder]) -> None:
        self._inner, self._finders = inner, finders

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, get_source, is_package …
        return getattr(self._inner, name)

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with contextlib.ExitStack() as stack:
            for finder in self._finders:
                if finder.live and finder.around is not None:
                    stack.enter_context(finder.around())
            self._inner.exec_module(module)
            if module.__spec__ is not None and module.__spec__.loader is self:
                module.__spec__.loader = self._inner  # reloads after uninstall use the plain loader
            module.__loader__ = self._inner
            for finder in self._finders:
                if finder.live:
                    finder.live = False
                    if finder in sys.meta_path:  # served: nothing left to wait for
                        sys.meta_path.remove(finder)
                    finder.fn(module)


def after_import(patcher: Any, name: str, fn: Callable[[Any], None],
                 around: Callable[[], ContextManager[Any]] | None = None) -> None:
    """``fn(module)`` once ``name`` is imported, while ``patcher``'s patches are in force
    (nothing after it restores: suspend or close); ``around()`` entered around the import and
    ``fn`` (when already imported: around ``fn``)."""
    module = sys.modules.get(name)
    if module is not None:
        with around() if around is not None else contextlib.nullcontext():
            fn(module)
        return
    finder = _Finder(name, fn, around)
    sys.meta_path.insert(0, finder)

    def remove() -> None:
        finder.live = False
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    patcher.after_restore(remove)


def finders() -> list[Any]:
    """The adapter's finders now on ``sys.meta_path`` (for tests and invariants)."""
    return [f for f in sys.meta_path if isinstance(f, _Finder)]
