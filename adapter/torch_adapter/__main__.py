"""``python -m torch_adapter ...`` — the same as the ``torch-adapter`` command."""

from torch_adapter.launch.startup_path import protect

protect()  # before anything else is imported: the working directory may hold a hostile rich.py

import sys  # noqa: E402

from torch_adapter.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
