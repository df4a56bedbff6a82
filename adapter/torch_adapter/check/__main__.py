"""``python -m torch_adapter.check ...``: the ``check`` command on its own."""

from torch_adapter.launch.startup_path import protect

protect()  # before anything else is imported: check never imports the scanned project

import sys  # noqa: E402

from torch_adapter.check.cli import main  # noqa: E402

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
