"""Run a function once a module is loaded: now if it already is, else right after it first
executes (a meta-path finder, removed when the session closes). The module itself is not
changed; the function sees it complete. ``around`` (a context manager factory) is entered
around the module's first execution and the function, for a module that builds tables from
torch's attributes as it executes (redirect/compiling.py: torch._dynamo)."""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from typing import Any, Callable, ContextManager

__all__ = ["after_import"]


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn: Callable[[Any], None],
                 around: Callable[[], ContextManager[Any]] | None = None) -> None:
        self.name, self.fn, self.live, self.around = name, fn, True, around

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or not self.live:
            return None
        # Every live finder for this name (nested sessions each have one) is served by the first
        # one reached; the others are skipped here, or each would search through the other forever.
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

    def __getattr__(self, name: str) -> Any:
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
                module.__spec__.loader = self._inner
            module.__loader__ = self._inner
            for finder in self._finders:
                if finder.live:
                    finder.live = False
                    finder.fn(module)


def after_import(session: Any, name: str, fn: Callable[[Any], None],
                 around: Callable[[], ContextManager[Any]] | None = None) -> None:
    """``fn(module)`` once ``name`` is imported, within ``session`` (nothing after it closes);
    ``around()`` entered around the import and ``fn`` (when already imported: around ``fn``)."""
    module = sys.modules.get(name)
    if module is not None:
        with around() if around is not None else contextlib.nullcontext():
            fn(module)
        return
    finder = _Finder(name, fn, around)
    sys.meta_path.insert(0, finder)

    def close() -> None:
        finder.live = False
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    session.closers.append(close)
