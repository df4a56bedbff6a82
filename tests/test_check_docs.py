"""docs/check.md embeds the rule table generated from the rule data; this keeps them in sync.

Regenerate the table with ``python tests/test_check_docs.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "check.md"
BLOCK = re.compile(r"(<!-- rules:begin -->\n)(.*?)(<!-- rules:end -->)", re.S)


def generated_table() -> str:
    from torch_adapter.check.render_rules import rule_rows, rules_markdown
    from torch_adapter.check.rules import RUNTIME_RULES
    from torch_adapter.check.ruleset import build_ruleset

    return rules_markdown(rule_rows(build_ruleset().rules, RUNTIME_RULES))


def test_rule_table_in_docs_is_current():
    m = BLOCK.search(DOC.read_text(encoding="utf-8"))
    assert m, "docs/check.md lacks the <!-- rules:begin --> / <!-- rules:end --> markers"
    assert m.group(2) == generated_table(), "the rule table changed: run `python tests/test_check_docs.py`"


def test_docs_name_every_note_kind_and_exit_code():
    text = DOC.read_text(encoding="utf-8")
    for kind in ("syntax-error", "undecodable", "binary", "too-large", "unreadable", "not-regular",
                 "broken-symlink", "symlink-loop", "symlink-duplicate", "notebook-invalid", "run-failed"):
        assert f"`{kind}`" in text, kind
    assert "torch-adapter.check-report" in text and "torch-adapter.routing-log" in text


def main() -> int:
    text = DOC.read_text(encoding="utf-8")
    new = BLOCK.sub(lambda m: m.group(1) + generated_table() + m.group(3), text)
    DOC.write_text(new, encoding="utf-8")
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(DOC.parent.parent / "adapter"))
    sys.exit(main())
