from __future__ import annotations

import sys

from app.commands import main

if __name__ == "__main__":
    sys.exit(main())
