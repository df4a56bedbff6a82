"""Start-up activation for child processes (the ``torch_adapter_autoinstall.pth`` hook).

The ``.pth`` file installed with the package runs one line at every interpreter start:
it does nothing unless ``TORCH_ADAPTER_AUTOINSTALL`` is set, and then calls
:func:`activate`, which installs the adapter with the settings the parent process
serialised into that variable (JSON). This is how ``mp.spawn`` children, DataLoader
workers started with "spawn", and ``torchrun`` ranks are adapted (the pattern is
coverage.py's subprocess measurement).

It runs once per interpreter: CPython may process one ``.pth`` twice (a site folder reached
by two spellings, e.g. a venv's ``lib64 -> lib`` link), and a second call does nothing —
so a failure is reported once, and the adapter is never installed twice.
"""

from __future__ import annotations

import json
import os
import sys

from ..core.config import CHILD_SETTINGS_ENV as ENV_VAR

__all__ = ["activate"]

_ACTIVATED = False  # the run-once guard (this module stays in sys.modules between .pth lines)


def activate() -> None:
    global _ACTIVATED
    raw = os.environ.get(ENV_VAR, "")
    if not raw or _ACTIVATED:
        return
    _ACTIVATED = True
    try:
        settings = json.loads(raw) if raw.strip().startswith("{") else {"target": raw}
        from torch_adapter.launch import child_report as _child_report, exit_guard as _exit_guard
        from torch_adapter.session import install

        child = {key: settings.pop(key) for key in _child_report.CHILD_KEYS if key in settings}
        session = install(**settings)
        if child and session.config.propagate:  # grandchildren announce themselves too
            session.patcher.set_env(ENV_VAR, raw)
        _child_report.start(child, session)
        _exit_guard.arm_at_shutdown("this adapted process")
    except Exception as exc:  # never break the child's start-up: say why and go on
        print(
            f"torch_adapter: could not adapt this child process ({type(exc).__name__}: {exc}); "
            f"it runs without the adapter. Unset {ENV_VAR} to silence this.",
            file=sys.stderr,
        )
