"""What a notebook user sees of errors and warnings while the extension is loaded.

- **Fixes** in the adapter's messages name the magics (``%adapter policy warn``), which exist
  while the extension is loaded (``core.callsite.running_as`` says "notebook").
- **Tracebacks** leave out the adapter's own frames (:mod:`torch_adapter.core.tracebacks`):
  the shell's traceback formatter (``shell.InteractiveTB``) gets the trimmed chain; the
  exception itself and ``sys.last_traceback`` keep every frame, so ``%debug`` still
  reaches them. Set as an attribute of that formatter instance, removed at unload.
- **Warnings** attributed to a notebook cell name it as the pill and the reports do —
  ``cell [9], line 1: FallbackWarning: ...`` and the cell's line under it — not by the
  kernel's temp file: :data:`warnings.formatwarning` (the hook Python's warnings module
  offers for that) is wrapped, and put back at unload if it is still ours. Warnings from
  other files read as before.
"""

from __future__ import annotations

import linecache
import warnings
from typing import Any

__all__ = ["install", "uninstall"]

_STATE: dict[str, Any] = {}


def _format_traceback(original: Any) -> Any:
    from ..core.tracebacks import user_traceback

    def structured_traceback(etype: Any, evalue: Any, etb: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            etb = user_traceback(etb)
        except Exception:  # never lose the user's error over how it is shown
            pass
        return original(etype, evalue, etb, *args, **kwargs)

    structured_traceback.__torch_adapter__ = True  # type: ignore[attr-defined]
    return structured_traceback


def _format_warning(original: Any) -> Any:
    from ..core.callsite import cell_of

    def formatwarning(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
        cell = cell_of(filename) if isinstance(filename, str) else None
        if cell is None:
            return original(message, category, filename, lineno, line)
        source = (line if line is not None else linecache.getline(filename, lineno)).strip()
        text = f"cell [{cell}], line {lineno}: {category.__name__}: {message}\n"
        return text + (f"  {source}\n" if source else "")

    formatwarning.__torch_adapter__ = True  # type: ignore[attr-defined]
    return formatwarning


def install(shell: Any) -> None:
    """Trim tracebacks shown by ``shell`` and name cells in warnings (idempotent)."""
    if _STATE:
        return
    from ..core.callsite import front

    front.append("notebook")  # fixes in messages name the magics (errors.setting)
    _STATE["front"] = True
    tb = getattr(shell, "InteractiveTB", None)
    if tb is not None and hasattr(tb, "structured_traceback"):
        had = "structured_traceback" in vars(tb)
        _STATE["tb"] = (tb, had, vars(tb).get("structured_traceback"))
        tb.structured_traceback = _format_traceback(tb.structured_traceback)
    _STATE["warn"] = warnings.formatwarning
    warnings.formatwarning = _format_warning(warnings.formatwarning)


def uninstall() -> None:
    """Put the shell's formatter and ``warnings.formatwarning`` back (if still ours)."""
    if "tb" in _STATE:
        tb, had, before = _STATE.pop("tb")
        if getattr(vars(tb).get("structured_traceback"), "__torch_adapter__", False):
            if had:
                tb.structured_traceback = before
            else:
                del tb.structured_traceback
    if _STATE.get("front"):
        from ..core.callsite import front

        if "notebook" in front:
            del front[len(front) - 1 - front[::-1].index("notebook")]  # the innermost one
    if "warn" in _STATE:
        before = _STATE.pop("warn")
        if getattr(warnings.formatwarning, "__torch_adapter__", False):
            warnings.formatwarning = before
    _STATE.clear()
