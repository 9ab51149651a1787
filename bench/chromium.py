"""How the benchmark and the browser tests start Debian's Chromium (``playwright install``
cannot run here): its path (``CHROMIUM`` overrides it) and the flags of a quiet headless run."""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
