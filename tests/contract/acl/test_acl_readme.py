"""The README's "ACL facade" table names every call the facade offers: each public function (and
struct class) of ``acl``, ``acl.rt``, ``acl.mdl``, ``acl.nn``, ``acl.util`` and ``acl.media``
has a row, by its ACL C name or its pyACL spelling."""

from __future__ import annotations

import re
from pathlib import Path

from streamrt import acl, ops

README = Path(__file__).resolve().parents[3] / "README.md"
PREFIX = {"": "acl", "rt": "aclrt", "mdl": "aclmdl", "nn": "aclnn", "util": "", "media": "acldvpp"}
# the facade's names that are not calls of an ACL API: constants' modules, tables
NOT_CALLS = {"constants", "errors", "mdl", "media", "nn", "rt", "util", "ORDER"}


def acl_names() -> str:
    """The table's left column (the ACL names) of the README's "ACL facade" section."""
    text = README.read_text()
    start = text.index("## ACL facade")
    end = text.find("\n## ", start + 1)
    rows = [line for line in text[start:end if end >= 0 else None].splitlines()
            if line.startswith("| ") and not line.startswith("| ACL name")]
    assert len(rows) > 20
    return "\n".join(row.split(" | ")[0] for row in rows)


def c_name(ns: str, name: str) -> str:
    """``aclrtMemPoolCreate`` from ``rt``, ``mem_pool_create`` (``ri`` spelt ``RI``)."""
    camel = "".join("RI" if w == "ri" else w[:1].upper() + w[1:] for w in name.split("_"))
    return PREFIX[ns] + (camel.removeprefix("Dvpp") if ns == "media" else camel)


def offered(ns: str) -> list[str]:
    mod = getattr(acl, ns) if ns else acl
    names = [n for n in mod.__all__ if not n.startswith("ACL") and n not in NOT_CALLS]
    assert all(callable(getattr(mod, n)) for n in names), ns
    return names


def test_every_offered_call_has_a_row():
    text = acl_names()
    missing = []
    for ns in PREFIX:
        for name in offered(ns):
            if ns == "nn" and name.removesuffix("_get_workspace_size") in ops.OPS:
                continue  # the aclnnXxx row: every operator of ops.OPS, both phases
            # by its C name, or its pyACL spelling as a whole name (``acl.rt.x`` or ``x``)
            pyacl = rf"(?<![\w.])(acl\.{ns + '.' if ns else ''})?{name}(?!\w)"
            if c_name(ns, name) not in text and not re.search(pyacl, text):
                missing.append(f"acl.{ns}.{name}".replace("acl..", "acl.") + f" ({c_name(ns, name)})")
    assert not missing, "README 'ACL facade' table lacks rows for: " + ", ".join(missing)


def test_every_shipped_operator_is_offered_in_both_phases():
    # (what the aclnnXxx row promises)
    for op in ops.OPS:
        assert callable(getattr(acl.nn, op)) and callable(getattr(acl.nn, f"{op}_get_workspace_size"))
