"""Op names: the canonical spelling of an op the user names (``"nonzero"``, ``"aten::add.Tensor"``,
``torch.ops.aten.add.Tensor``), every name this torch knows, and "did you mean" for the rest."""

from __future__ import annotations

import difflib
import functools
from typing import Any

from ..core.torch_private import all_op_names
from ..errors import UsageError, format_error
from . import ops_table

__all__ = ["known_op_names", "is_known_op", "candidates", "op_name", "forget"]


def known_op_names() -> frozenset[str]:
    """Every op name the table or the dispatcher knows (custom ops registered later included)."""
    return frozenset(ops_table.load_table()) | frozenset(all_op_names())


_KNOWN: list[frozenset[str]] = []
_NOT_OPS: set[str] = set()  # names seen that are no op (profiler ranges such as "autograd::engine::...")


def is_known_op(name: str) -> bool:
    """``name in known_op_names()``, cheap on a hot path (after every notebook cell): the set is
    cached and re-read from the dispatcher only for a name it has not seen (an op registered
    since); names that are no op are remembered as such (an op observed was registered first)."""
    if _KNOWN and name in _KNOWN[0]:
        return True
    if name in _NOT_OPS:
        return False
    _KNOWN[:] = [known_op_names()]
    if name in _KNOWN[0]:
        return True
    _NOT_OPS.add(name)
    return False


@functools.lru_cache(maxsize=1)
def _namespaces() -> frozenset[str]:
    return frozenset(n.partition("::")[0] for n in all_op_names())


def candidates(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("torch.ops."):
        text = text[len("torch.ops."):]
    if "::" not in text:
        head, dot, rest = text.partition(".")
        text = f"{head}::{rest}" if dot and head in _namespaces() else f"aten::{text}"
    if text.endswith(".default"):
        text = text[: -len(".default")]
    return [text]


def op_name(op: Any, *, call: str = "torch_adapter.explain()") -> str:
    """The canonical name of ``op`` (an OpOverload or a string); UsageError if unknown."""
    name_fn = getattr(op, "name", None)
    if callable(name_fn) and hasattr(op, "_schema"):
        return str(name_fn())
    if hasattr(op, "overloads") and hasattr(op, "_qualified_op_name"):  # an OpOverloadPacket
        return op_name(op._qualified_op_name, call=call)
    if not isinstance(op, str):
        raise UsageError(format_error(call, 'an op name such as "aten::nonzero" or an OpOverload',
                                      f"{op!r} ({type(op).__name__})",
                                      fix='pass e.g. "aten::add.Tensor" or torch.ops.aten.add.Tensor'))
    names = known_op_names()
    (name,) = candidates(op)
    if name in names:
        return name
    overloads = sorted(n for n in names if n.startswith(name + "."))
    if overloads:
        raise UsageError(format_error(
            call, "one overload of the op", f"{op!r}, which names {len(overloads)} overloads",
            why="routes differ per overload", fix=f"name one of: {', '.join(overloads[:8])}"))
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.75)
    raise UsageError(format_error(
        call, 'an op this torch knows, e.g. "aten::nonzero" or "aten::add.Tensor"', repr(op),
        why="no operator of that name is registered",
        fix=f"did you mean {' or '.join(close)}?" if close else
        "list op names with torch._C._dispatch_get_all_op_names()"))


def forget() -> None:
    """Forget the cached op names (after registering new custom ops)."""
    _KNOWN.clear()
    _NOT_OPS.clear()
