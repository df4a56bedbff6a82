"""Keep the working directory off ``sys.path`` for ``python -m torch_adapter[.check]``.

``python -m`` puts the working directory first on ``sys.path``; inside a project, a file
named like one of torch_adapter's dependencies (``rich.py``, ``yaml.py``) would then be
imported — and run — by the tool. :func:`protect` swaps that entry, before anything else is
imported, for a folder that does not exist inside the package (so nothing can be imported
from it, and no installed package is moved ahead of the standard library); the entry stays,
so code that sets ``sys.path[0]`` (``runner.py``) replaces it as it would the working directory. ``torch-adapter run`` still gives the user's script the path Python would
(``runner.py``). Only ``os`` and ``sys`` are used: both are loaded before any user file can be.
"""

import os
import sys

__all__ = ["protect"]


def protect() -> None:
    if not sys.path or sys.flags.safe_path:
        return
    first = sys.path[0]
    try:
        is_cwd = os.path.abspath(first or os.curdir) == os.getcwd()
    except OSError:  # the working directory was removed
        is_cwd = first in ("", os.curdir)
    if is_cwd:
        sys.path[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_nothing_to_import_here")
