"""``python -m streamrt``: the same command line as the ``streamrt`` script."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
