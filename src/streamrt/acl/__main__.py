"""``python -m streamrt.acl program.py [args]``: run an unmodified pyACL program on streamrt.

``import acl`` (and ``acl.rt``, ``acl.util``, ...) resolve to the facade for this run only: the
aliases go into ``sys.modules`` here, in the runner, and nowhere else, so a real pyACL
installation is never shadowed by importing streamrt. The program runs as ``__main__`` with
``sys.argv`` set to ``[program.py, *args]`` and its directory first on ``sys.path``, as
``python program.py args`` would run it."""

from __future__ import annotations

import os
import runpy
import sys

import streamrt.acl as facade

USAGE = "usage: python -m streamrt.acl program.py [args ...]"
SUBMODULES = ("rt", "mdl", "nn", "util", "media", "constants", "errors")


def install_aliases() -> None:
    """``acl`` and its submodules are the facade's (the same module objects, one state)."""
    sys.modules["acl"] = facade
    for name in SUBMODULES:
        sys.modules[f"acl.{name}"] = getattr(facade, name)


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` as a pyACL program with ``argv[1:]`` as its arguments."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    path = argv[0]
    if not os.path.isfile(path):
        print(f"streamrt.acl: {path}: no such file\n{USAGE}", file=sys.stderr)
        return 2
    install_aliases()
    sys.argv = [path, *argv[1:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
