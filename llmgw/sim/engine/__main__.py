"""``python -m llmgw.sim.engine``: the sim engine as a process (``cli.main``)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
