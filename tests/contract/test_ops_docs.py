"""Operator documentation: every operator's docstring, what help() shows, ``streamrt info --ops``."""

from __future__ import annotations

import pydoc
import subprocess
import sys

import pytest

from streamrt import cli, ops

NAMES = sorted(ops.OPS)


def help_text(obj) -> str:
    """What ``help(obj)`` prints (pydoc's plain-text rendering, without the pager)."""
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


@pytest.mark.parametrize("name", NAMES)
def test_ops_docstring_names_every_slot_attribute_dtype_and_the_workspace(name):
    op = ops.OPS[name]
    doc = type(op).__doc__
    assert doc and doc.startswith(f"ops.{name}(")
    flat = " ".join(doc.split())  # the docstring is wrapped: compare words
    for slot in op.inputs + op.outputs:
        assert f"    {slot}: " in doc, slot
        assert type(op).slot_docs.get(slot), f"ops.{name}: slot {slot} is undocumented"
    for attr, spec in op.attrs.items():
        assert spec.doc, f"ops.{name}: attribute {attr} has no description"
        assert f"    {attr} (" in doc and f"default {spec.default!r}" in doc
        assert " ".join(spec.doc.split()) in flat
    for dt in op.dtypes:
        assert dt.name in doc
    ws = type(op).workspace_doc
    assert ws != "0 bytes." and f"Workspace: {' '.join(ws.split())}" in flat  # written, not the default
    for opt in op.optional:
        assert "Optional: None" in doc.split(f"    {opt}: ", 1)[1].split("\n", 1)[0]


def test_ops_docstrings_document_the_attributes_users_asked_about():
    assert "axis (int, default -1)" in ops.softmax.__doc__
    ln = ops.layer_norm.__doc__
    assert "eps (float, default 1e-05)" in ln and "normalized_ndim (int or None, default None)" in ln
    assert "weight=None" in ln and "bias=None" in ln  # optional inputs
    assert "alpha (float, default 1.0)" in ops.add.__doc__
    assert "keepdims (bool, default False)" in ops.reduce_sum.__doc__
    assert "0 bytes" in ops.add.__doc__  # when the workspace is empty, it says so


@pytest.mark.parametrize("name", NAMES)
def test_ops_help_shows_our_docs_not_numpys(name):
    op = ops.OPS[name]
    text = help_text(op)
    assert f"ops.{name}(" in text and "Workspace:" in text and "Use:" in text
    # add and mul held numpy's ufunc as a public class attribute: help() printed its docstring
    for numpy_doc in ("<ufunc", "arguments element-wise", "Parameters\n", "x1, x2"):
        assert numpy_doc not in text, numpy_doc
    assert "get_workspace_size" in text  # the methods are still listed


def test_ops_attr_repr_is_readable():
    assert repr(ops.add.attrs["alpha"]) == "Attr(float, default=1.0)"


def test_cli_info_ops_lists_every_operator():
    r = subprocess.run([sys.executable, "-m", "streamrt.cli", "info", "--ops"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"operators ({len(ops.OPS)})" in out
    blocks = {}
    for name in NAMES:  # each operator's block: its signature line up to the next operator
        op = ops.OPS[name]
        ins = ", ".join(f"{s}=None" if s in op.optional else s for s in op.inputs)
        head = f"  ops.{name}({ins}) -> {', '.join(op.outputs)}\n"
        assert head in out, head
        blocks[name] = out.split(head, 1)[1].split("\n  ops.", 1)[0]
    for name, block in blocks.items():
        op = ops.OPS[name]
        attrs = ", ".join(f"{k}={a.default!r}" for k, a in op.attrs.items()) or "none"
        assert f"attributes: {attrs}\n" in block, (name, block)
        assert f"dtypes:     {', '.join(dt.name for dt in op.dtypes)}\n" in block
        assert "workspace:" in block
    assert "layer_norm(x, weight=None, bias=None) -> out" in out
    assert "attributes: eps=1e-05, normalized_ndim=None" in out


def test_cli_info_ops_in_process(capsys):
    assert cli.main(["info", "--ops"]) == 0
    out = capsys.readouterr().out
    assert all(f"ops.{n}(" in out for n in NAMES) and "backends:" not in out
