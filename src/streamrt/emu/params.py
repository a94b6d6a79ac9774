"""Kernel signatures checked against CUDA C: the tokens, and the source's parameter list.

A signature is comma-separated tokens: ``ptr`` (read and write), ``const ptr`` (read only),
scalars ``i32 i64 u32 u64 f32 f64`` (and ``i8 u8 i16 u16``, which NVRTC's packer takes too).
The parameter list of ``extern "C" __global__ void NAME(...)`` is read with a small parser
(comments dropped, split at top-level commas); a list it cannot read (a macro expanding to
parameters) is not checked, and a scalar of a type it does not know (a typedef) is checked for
count only.
"""

from __future__ import annotations

import functools
import re

from ..errors import InvalidTypeError, InvalidValueError

SCALARS = ("i32", "i64", "u32", "u64", "f32", "f64", "i8", "u8", "i16", "u16")
_C_TYPES = {  # C spellings (qualifiers and std:: dropped, words joined by one space)
    "int": "i32", "signed": "i32", "signed int": "i32", "int32_t": "i32",
    "unsigned": "u32", "unsigned int": "u32", "uint32_t": "u32",
    "long": "i64", "long int": "i64", "long long": "i64", "long long int": "i64",
    "signed long": "i64", "signed long long": "i64", "int64_t": "i64", "ptrdiff_t": "i64",
    "unsigned long": "u64", "unsigned long int": "u64", "unsigned long long": "u64",
    "unsigned long long int": "u64", "uint64_t": "u64", "size_t": "u64",
    "float": "f32", "double": "f64",
    "char": "i8", "signed char": "i8", "int8_t": "i8",
    "unsigned char": "u8", "uint8_t": "u8", "bool": "u8",
    "short": "i16", "short int": "i16", "signed short": "i16", "int16_t": "i16",
    "unsigned short": "u16", "unsigned short int": "u16", "uint16_t": "u16",
}
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}
_IDENT = re.compile(r"[A-Za-z_]\w*")


@functools.lru_cache(maxsize=512)
def parse_tokens(signature: str) -> tuple[str, ...]:
    """The normalised tokens of ``signature`` ("ptr", "const ptr", "i32", ...); a malformed one
    raises :class:`InvalidValueError`."""
    if not isinstance(signature, str):
        raise InvalidTypeError(f"a kernel signature must be a str like 'ptr, i32, f32', not "
                               f"{signature!r}")
    if not signature.strip():
        return ()
    out = []
    for i, raw in enumerate(signature.split(",")):
        token = " ".join(raw.split())
        if token not in ("ptr", "const ptr", *SCALARS):
            raise InvalidValueError(
                f"kernel signature {signature!r}: parameter {i} is {token!r}, not a type; the "
                f"tokens are ptr, const ptr, {', '.join(SCALARS)}")
        out.append(token)
    return tuple(out)


@functools.lru_cache(maxsize=512)
def source_params(source: str, name: str) -> tuple[str, ...] | None:
    """The parameter declarations of kernel ``name`` in ``source``; None when the source
    declares no ``extern "C" __global__`` function of that name. Raises nothing."""
    text = _COMMENTS.sub(" ", source)
    head = re.compile(r'extern\s+"C"\s+([^;{}()]*(?:\([^()]*\)[^;{}()]*)*?)\b' + re.escape(name)
                      + r"\s*\(")
    for m in head.finditer(text):
        if "__global__" not in m[1].split():
            continue
        depth, start, parts = 0, m.end(), []
        for i in range(m.end(), len(text)):
            c = text[i]
            if c in "([<":
                depth += 1
            elif c in ")]>":
                if depth == 0:  # the closing parenthesis of the list
                    parts.append(text[start:i])
                    decls = tuple(" ".join(p.split()) for p in parts)
                    return () if decls in (("",), ("void",)) else decls
                depth -= 1
            elif c == "," and depth == 0:
                parts.append(text[start:i])
                start = i + 1
        return None
    return None


def kind_of(decl: str) -> str | None:
    """What C parameter ``decl`` takes: "ptr" or "const ptr" (a pointer to const), a scalar
    token, "?" (a scalar of a type not known here), or None (not a plain declaration: a macro)."""
    if "(" in decl or not decl:
        return None
    d = decl.split("=")[0].strip()
    if d.endswith("]"):  # T name[] is a pointer
        d = d[: d.index("[")] + "*"
    if "*" in d:
        pointee = d[: d.rindex("*")]
        return "const ptr" if "const" in _IDENT.findall(pointee) else "ptr"
    words = [w for w in re.findall(r"[A-Za-z_][\w:]*", d) if w not in _QUALIFIERS]
    words = [w.removeprefix("std::") for w in words]
    if len(words) > 1 and " ".join(words) not in _C_TYPES:
        words = words[:-1]  # the parameter's name
    return _C_TYPES.get(" ".join(words), "?")


def check(source: str, name: str, signature: str, *, need_source: bool = False) -> tuple[str, ...]:
    """The tokens of ``signature`` once checked against kernel ``name``'s parameters in
    ``source``: a malformed signature, a count or a type that does not match (or, with
    ``need_source``, no such kernel in the source) raises :class:`InvalidValueError`."""
    tokens = parse_tokens(signature)
    decls = source_params(source, name)
    if decls is None:
        if need_source:
            raise InvalidValueError(f'the CUDA source has no extern "C" __global__ void '
                                    f"{name}(...): the kernel's name must be its function's")
        return tokens
    kinds = [kind_of(d) for d in decls]
    if None in kinds:
        return tokens  # a parameter list this parser cannot read (a macro): left to the compiler
    where = f"{name}({', '.join(decls)})"
    if len(kinds) != len(tokens):
        raise InvalidValueError(f"kernel {name!r}: the signature {signature!r} has {len(tokens)} "
                                f"parameter(s), the source's {where} {len(kinds)}")
    for i, (tok, kind, decl) in enumerate(zip(tokens, kinds, decls, strict=True)):
        ok = (tok == kind or (tok == "ptr" and kind == "const ptr")
              or (kind == "?" and tok not in ("ptr", "const ptr")))
        if not ok:
            why = ("'const ptr' promises the kernel only reads it: declare the pointee const"
                   if tok == "const ptr" and kind == "ptr" else f"that is {kind!r}")
            raise InvalidValueError(f"kernel {name!r}: signature parameter {i} is {tok!r}, the "
                                    f"source's is {decl!r} ({why}) in {where}")
    return tokens
