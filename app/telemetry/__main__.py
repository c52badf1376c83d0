"""``python -m app.telemetry``: same as ``python -m app telemetry``."""

from __future__ import annotations

import sys

from app.telemetry.cli import main

if __name__ == "__main__":
    sys.exit(main())
