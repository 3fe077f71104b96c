"""``python -m xpbank demo``: the same command line as ``xpbank``."""

from __future__ import annotations

from xpbank.tools.cli import main

if __name__ == "__main__":
    main()
