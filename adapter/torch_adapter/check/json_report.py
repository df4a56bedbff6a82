"""JSON rendering of a check report (schema ``torch-adapter.check-report``, version 1).

A pure function of the :class:`~.model.Report`; the document's fields are described in
``docs/check.md``. :func:`load_report_json` reads one back (for tools and tests).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CheckError, format_error
from .model import READS, SCHEMA, VERSION, Report

__all__ = ["render_json", "load_report_json"]


def render_json(report: Report, *, indent: int | None = 1) -> str:
    """The report as a JSON document (UTF-8 text, newline-terminated)."""
    return json.dumps(report.to_dict(), indent=indent, ensure_ascii=False) + "\n"


def load_report_json(text: str) -> dict[str, Any]:
    """Parse a report written by :func:`render_json`, checking schema and version."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CheckError(format_error("load_report_json()", "a JSON document", f"{text[:40]!r}...",
                                      why=str(exc), fix="pass the file written by `check --output x.json`")) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") not in READS:
        got = {k: data.get(k) for k in ("schema", "version")} if isinstance(data, dict) else type(data).__name__
        raise CheckError(format_error("load_report_json()", f"schema {SCHEMA!r} version {VERSION}", repr(got),
                                      fix="regenerate the report with this version of torch-adapter"))
    return data
