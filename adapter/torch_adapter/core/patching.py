"""Reversible attribute patches.

A :class:`Patcher` records, for each ``(owner, name)`` it patches, whether the name lived
in the owner's own ``__dict__`` and the exact object that was there, and puts it back on
:meth:`restore` (``del`` when the name was inherited, so that ``Tensor.to`` resolves to the
identical ``TensorBase.to`` again). Patching the same attribute twice keeps the first
original. Nothing here knows about torch: it is the mechanism, the redirect modules are
the data.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

__all__ = ["Patcher", "MISSING", "bindings", "STAND_IN", "mark_stand_in", "original_of"]


class _Missing:
    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return "<missing>"


MISSING: Any = _Missing()


class Patcher:
    """Owns a set of patches and undoes them all, in reverse order."""

    def __init__(self) -> None:
        # (id(owner), name) -> (owner, name, had_own, original)
        self._saved: dict[tuple[int, str], tuple[Any, str, bool, Any]] = {}
        self._order: list[tuple[int, str]] = []
        self._env: dict[str, str | None] = {}
        self._after: list[Any] = []
        self._before: list[Any] = []
        self._items: list[tuple[Any, Any, Any]] = []

    def __len__(self) -> int:
        return len(self._saved)

    def original(self, owner: Any, name: str) -> Any:
        """The value before we patched it (or the current one if unpatched)."""
        key = (id(owner), name)
        if key in self._saved:
            return self._saved[key][3]
        return getattr(owner, name, MISSING)

    def is_patched(self, owner: Any, name: str) -> bool:
        return (id(owner), name) in self._saved

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Set ``owner.name = value`` and remember what to restore. Returns the original."""
        key = (id(owner), name)
        if key not in self._saved:
            own = _own_dict(owner)
            had_own = name in own
            original = own[name] if had_own else getattr(owner, name, MISSING)
            self._saved[key] = (owner, name, had_own, original)
            self._order.append(key)
        setattr(owner, name, value)
        return self._saved[key][3]

    def set_item(self, mapping: Any, key: Any, value: Any) -> None:
        """``mapping[key] = value`` (a registry dict such as ``copyreg.dispatch_table``),
        restorable: the old value is put back, or the key removed if it was absent."""
        if not any(m is mapping and k == key for m, k, _ in self._items):
            self._items.append((mapping, key, mapping.get(key, MISSING)))
        mapping[key] = value

    def set_env(self, name: str, value: str | None) -> None:
        """Set (or with ``None`` unset) an environment variable, restorable."""
        if name not in self._env:
            self._env[name] = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    def after_restore(self, fn: Any) -> None:
        """Run ``fn()`` once :meth:`restore` has put every attribute back (newest first):
        for caches that torch built from the patched attributes and must rebuild."""
        self._after.append(fn)

    @contextlib.contextmanager
    def suspended(self, only: Any = None) -> Iterator[None]:
        """Torch's own attributes back for the block, the patches again after it: for a cache
        torch builds once from its attributes (``redirect/compiling.py``: torch._dynamo's tables).
        ``only(owner, name, original)`` limits it to the patches it accepts (``redirect/torchscript.py``:
        the Python functions TorchScript compiles). Not for hot paths: other threads see those
        attributes unpatched meanwhile."""
        keys = [key for key in self._order if only is None or only(*(self._saved[key][i] for i in (0, 1, 3)))]
        current = [(key, getattr(self._saved[key][0], self._saved[key][1], MISSING)) for key in keys]
        for key, _ in reversed(current):
            owner, name, had_own, original = self._saved[key]
            if original is MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        try:
            yield
        finally:
            for key, value in current:
                owner, name = self._saved[key][:2]
                if value is not MISSING:
                    setattr(owner, name, value)

    def before_restore(self, fn: Any) -> None:
        """Run ``fn(values)`` when :meth:`restore` starts, with the objects that stand in for
        torch's (the patched values): for caches that may have picked them up."""
        self._before.append(fn)

    def patches(self) -> list[tuple[Any, str, Any, Any]]:
        """``(owner, name, original, value now)`` for every patch, oldest first: for tables torch
        keys by its objects' identity (``redirect/torchscript.py``, ``redirect/torch_tables.py``)."""
        out = []
        for key in self._order:
            owner, name, _had, original = self._saved[key]
            out.append((owner, name, original, getattr(owner, name, MISSING)))
        return out

    def values(self) -> list[Any]:
        """The objects patched in, as they are now."""
        return [getattr(owner, name, MISSING) for owner, name, _had, _orig in self._saved.values()]

    def restore(self) -> None:
        """Undo every patch, newest first; the environment as it was; then the
        :meth:`after_restore` callbacks. All or nothing: a callback or an attribute that fails
        does not stop the rest — every attribute is put back, every callback runs, and then
        one :class:`~torch_adapter.errors.RestoreError` names everything that failed."""
        failures: list[tuple[str, BaseException]] = []

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except BaseException as exc:  # keep restoring; report after
                failures.append((what, exc))

        before, self._before = self._before, []
        values = self.values()
        for fn in reversed(before):
            attempt(f"before_restore {_name(fn)}", fn, values)
        for key in reversed(self._order):
            owner, name, had_own, original = self._saved[key]
            attempt(f"{_name(owner)}.{name}", _put_back, owner, name, had_own, original)
        self._saved.clear()
        self._order.clear()
        for mapping, key, old in reversed(self._items):
            attempt(f"item {key!r}", _put_item, mapping, key, old)
        self._items.clear()
        for name, value in self._env.items():
            attempt(f"env {name}", _put_env, name, value)
        self._env.clear()
        after, self._after = self._after, []
        for fn in reversed(after):
            attempt(f"after_restore {_name(fn)}", fn)
        if failures:
            from ..errors import RestoreError

            raise RestoreError(failures)


def _put_back(owner: Any, name: str, had_own: bool, original: Any) -> None:
    if had_own:
        setattr(owner, name, original)
        return
    try:
        delattr(owner, name)
    except AttributeError:
        pass
    if original is not MISSING and getattr(owner, name, MISSING) is not original:
        setattr(owner, name, original)


def _put_item(mapping: Any, key: Any, old: Any) -> None:
    if old is MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = old


def _put_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__


def _own_dict(owner: Any) -> Any:
    try:
        return vars(owner)
    except TypeError:
        return {}


def bindings(objects: Any, *, within: str | None = None, name: str | None = None) -> list[tuple[Any, str, Any]]:
    """Where loaded modules hold one of ``objects`` (an object or an iterable of them, matched by
    identity): ``(module, attribute, object)`` for its home and every module that bound it with
    ``from ... import``. ``within`` keeps the modules of one package (``"torch.distributed"``:
    it and its sub-modules); ``name`` keeps one attribute name. The one scan of ``sys.modules`` for
    bindings: a patch meant for a function must reach the copies other modules hold, or the
    callers through them keep torch's own."""
    wanted = {id(o): o for o in (objects if isinstance(objects, (list, tuple, set, frozenset)) else (objects,))}
    found = []
    for modname, module in sorted(sys.modules.items(), key=lambda kv: kv[0]):
        if module is None or within is not None and not (modname == within or modname.startswith(within + ".")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        items = [(name, namespace[name])] if name is not None and name in namespace else \
            [] if name is not None else list(namespace.items())
        found += [(module, attr, value) for attr, value in items if id(value) in wanted and wanted[id(value)] is value]
    return found


# The one mark of a stand-in: the attribute naming the torch object it stands in for (set on a
# function, or in a stand-in class's namespace). Readers ask original_of(); a stand-in built over
# another session's stand-in (nested sessions) names torch's own.
STAND_IN = "__torch_adapter_original__"


def original_of(obj: Any) -> Any:
    """The torch object ``obj`` stands in for; ``obj`` itself when it is no stand-in."""
    return getattr(obj, STAND_IN, obj)


def mark_stand_in(stand_in: Any, original: Any) -> Any:
    """Mark ``stand_in`` as standing in for ``original`` (torch's own, never another stand-in)."""
    setattr(stand_in, STAND_IN, original_of(original))
    return stand_in
