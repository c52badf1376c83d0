"""`python -m app.ui` = `python -m app gui`."""

from __future__ import annotations

import sys

from app.ui.main import main

if __name__ == "__main__":
    sys.exit(main())
