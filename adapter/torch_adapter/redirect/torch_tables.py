"""torch's tables of its own functions, and pickle's look-up by name, under the adapter's stand-ins.

Several torch subsystems recognise torch's functions by looking them up in tables built
once, at their first use, from torch's attributes of that moment (``_torch_private.
attribute_caches``): ``torch.overrides``' overridable / ignored / testing-override tables and
``resolve_name``'s index, the set of ``Tensor`` methods that ``torch.fx`` turns into
``call_method`` nodes, and ``torch.utils._device``'s factory set (``with torch.device``,
``set_default_device``), and the Tensor methods a lazy module's uninitialized parameters accept
(``torch.nn.parameter.UninitializedTensorMixin._allowed_methods``: ``LazyLinear(4).to("cuda")``
raised "Attempted to use an uninitialized parameter in <function Tensor.to>" without the stand-in
there). While installed, the names hold the adapter's stand-ins
(``torch.zeros_like`` is a wrapper, ``Tensor.to`` a Python function), and torch hands the
stand-in itself to ``__torch_function__`` wherever it looks the name up (``Tensor`` methods;
the factory wrappers, which run the protocol themselves: :mod:`.devices`). A table that knows
only torch's function misses the stand-in; one first built while installed knows only the
stand-in and misses torch's function, also after ``uninstall()``.

So :func:`prepare` (before any patch) builds every table from torch's own functions, and
:func:`register` (after every patch) **adds each stand-in next to the function it stands for**,
with the same entry (the same name in ``resolve_name``'s index, the same test override), in
every table that holds that function; ``uninstall()`` takes exactly those entries out again.
Both names are then recognised during the session, and only torch's afterwards.

**Pickling by name.** pickle saves a function or class as ``module.qualname`` and checks that
the name gives the object back. A stand-in keeps its own (``_VariableFunctionsClass.zeros``,
``StandIn.names.<locals>.<lambda>``), so pickling ``torch.zeros`` or ``torch.cuda.is_available``
failed while installed. :func:`register` names each stand-in after the attribute it stands in
(``torch.zeros``, ``torch.cuda.is_available``): pickled in the session, it loads as whatever the
name holds where it is loaded — torch's own after ``uninstall()`` or in a plain interpreter.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from ..core import torch_private as tp

__all__ = ["prepare", "register"]


def prepare(session: Any) -> None:
    """Before any patch: torch's attribute tables built from torch's own functions."""
    if session.target.device_type == "cuda":
        return
    for cache in tp.attribute_caches():
        cache()


def register(session: Any) -> None:
    """After every patch: each stand-in next to its original in torch's tables; names for pickle."""
    if session.target.device_type == "cuda":
        return
    pairs = [(orig, value) for _owner, _name, orig, value in session.patcher.patches()
             if orig is not value and _hashable(orig) and _hashable(value)]
    added: list[tuple[Any, Any]] = []  # (table, stand-in)
    for table in _tables():
        ids = {id(f) for f in table} if isinstance(table, list) else None  # a list is searched once
        for orig, value in pairs:
            if _add_beside(table, orig, value, ids):
                added.append((table, value))
    session.patcher.before_restore(lambda _values: _remove(added))
    for owner, name, _orig, value in session.patcher.patches():
        _name_for_pickle(owner, name, value)


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _tables() -> list[Any]:
    """The containers of torch's functions: sets, dicts keyed by function, lists in dicts."""
    import torch
    import torch.overrides as overrides

    overridable, index = overrides._get_overridable_functions()
    tables: list[Any] = [tp.device_constructors(), overrides.get_ignored_functions(),
                         overrides.get_testing_overrides(), index, overrides._get_tensor_methods()]
    tables += [funcs for funcs in overridable.values() if isinstance(funcs, list)]
    # The Tensor methods a lazy module's UninitializedParameter / UninitializedBuffer lets through
    # (moves and casts: Tensor.to, .cuda, .half …), a list built as torch.nn is imported.
    tables.append(torch.nn.parameter.UninitializedTensorMixin._allowed_methods)
    return tables


def _add_beside(table: Any, orig: Any, value: Any, ids: set[int] | None = None) -> bool:
    """Put ``value`` beside ``orig`` in ``table`` if ``orig`` is there and ``value`` is not
    (``ids``: the ids of a list table's items, kept up to date here)."""
    try:
        if isinstance(table, list):
            ids = {id(f) for f in table} if ids is None else ids
            present = id(orig) in ids and id(value) not in ids
        else:
            present = orig in table and value not in table
    except Exception:  # an object with an odd __eq__: not torch's function
        return False
    if not present:
        return False
    if isinstance(table, dict):
        table[value] = table[orig]
    elif isinstance(table, set):
        table.add(value)
    else:
        table.append(value)
        if ids is not None:
            ids.add(id(value))
    return True


def _remove(added: list[tuple[Any, Any]]) -> None:
    for table, value in reversed(added):
        if isinstance(table, dict):
            table.pop(value, None)
        elif isinstance(table, set):
            table.discard(value)
        else:
            for i, f in enumerate(table):
                if f is value:
                    del table[i]
                    break


def _lookup(module: str, qualname: str) -> Any:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        return None


def _name_for_pickle(owner: Any, name: str, value: Any) -> None:
    """Name a patched-in function or class after the attribute it stands in, when pickle's
    look-up of its own name does not give it back (module docstring)."""
    if not isinstance(value, (types.FunctionType, type)):
        return
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and _lookup(module, qualname) is value:
        return
    if isinstance(owner, types.ModuleType):
        module, prefix = owner.__name__, ""
    elif isinstance(owner, type) and _lookup(owner.__module__, owner.__qualname__) is owner:
        module, prefix = owner.__module__, owner.__qualname__ + "."
    else:
        return
    try:
        value.__module__ = module
        value.__qualname__ = prefix + name
    except (AttributeError, TypeError):  # a C type: left as it is
        pass
