"""``python -m torch_adapter ...`` — the same as the ``torch-adapter`` command."""

import sys

from torch_adapter.cli import main

sys.exit(main())
