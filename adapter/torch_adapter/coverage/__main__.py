"""``python -m torch_adapter.coverage ...``: the ``coverage`` command on its own.

``python -m torch_adapter.coverage --markdown docs/coverage.md -q`` regenerates the docs page.
"""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
