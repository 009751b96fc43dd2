"""A small reader of Lua source for the architecture tests: tokens without comments
and strings, block depth, top-level locals, function lengths and wire indexes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_LONG_OPEN = re.compile(r"\[(=*)\[")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_OPENERS = frozenset({"function", "if", "do", "repeat"})
_CLOSERS = frozenset({"end", "until"})


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "name", "number", "string", "op"
    text: str
    line: int


def tokens(source: str) -> Iterator[Token]:
    """The tokens of ``source``; comments dropped, each string one token."""
    i, line, n = 0, 1, len(source)
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif source.startswith("--", i):
            long = _LONG_OPEN.match(source, i + 2)
            if long:
                end = source.index("]" + long.group(1) + "]", long.end())
                stop = end + len(long.group(0))
            else:
                nl = source.find("\n", i)
                stop = n if nl < 0 else nl
            line += source.count("\n", i, stop)
            i = stop
        elif c == "[" and _LONG_OPEN.match(source, i):
            long = _LONG_OPEN.match(source, i)
            assert long is not None
            stop = source.index("]" + long.group(1) + "]", long.end()) + len(long.group(0))
            yield Token("string", source[i:stop], line)
            line += source.count("\n", i, stop)
            i = stop
        elif c in "'\"":
            j = i + 1
            while source[j] != c:
                j += 2 if source[j] == "\\" else 1
            yield Token("string", source[i : j + 1], line)
            i = j + 1
        elif m := _NAME.match(source, i):
            yield Token("name", m.group(0), line)
            i = m.end()
        elif m := _NUMBER.match(source, i):
            yield Token("number", m.group(0), line)
            i = m.end()
        else:
            three, two = source[i : i + 3], source[i : i + 2]
            op = three if three == "..." else two if two in {"==", "~=", "<=", ">=", ".."} else c
            yield Token("op", op, line)
            i += len(op)


def top_level_locals(source: str) -> list[str]:
    """The names the main chunk of ``source`` declares ``local`` outside any block (each
    name of ``local a, b = ...`` counts): what Lua's limit of 200 locals counts there."""
    names: list[str] = []
    toks = list(tokens(source))
    depth = 0
    for k, t in enumerate(toks):
        if t.kind != "name":
            continue
        if t.text in _OPENERS:
            depth += 1
        elif t.text in _CLOSERS:
            depth -= 1
        elif t.text == "local" and depth == 0:
            if toks[k + 1].text == "function":
                names.append(toks[k + 2].text)
                continue
            j = k + 1
            while toks[j].kind == "name":
                names.append(toks[j].text)
                if toks[j + 1].text != ",":
                    break
                j += 2
    return names


def function_lengths(source: str) -> list[tuple[str, int]]:
    """(name, lines from ``function`` to its ``end``) of each named function."""
    toks = list(tokens(source))
    stack: list[tuple[str | None, int]] = []
    out: list[tuple[str, int]] = []
    for k, t in enumerate(toks):
        if t.kind != "name":
            continue
        if t.text in _OPENERS:
            name = None
            if t.text == "function" and toks[k + 1].kind == "name":
                j, parts = k + 1, [toks[k + 1].text]
                while toks[j + 1].text in {".", ":"}:
                    parts.append(toks[j + 2].text)
                    j += 2
                name = ".".join(parts)
            stack.append((name, t.line))
        elif t.text in _CLOSERS:
            name, start = stack.pop()
            if name is not None:
                out.append((name, t.line - start + 1))
    return out


def bare_indexes(
    source: str, rows: frozenset[str], tables: frozenset[str]
) -> list[tuple[int, str]]:
    """(line, text) of each ``r[<number>]`` for an ``r`` in ``rows`` and each
    ``t[<anything>][<number>]`` for a ``t`` in ``tables`` (a table of rows)."""
    toks = list(tokens(source))
    found = []
    for k, t in enumerate(toks):
        if t.kind != "name":
            continue
        j = k + 1
        if t.text in tables and toks[j].text == "[":
            depth = 0
            while True:
                depth += {"[": 1, "]": -1}.get(toks[j].text, 0)
                j += 1
                if depth == 0:
                    break
        elif t.text not in rows or (k > 0 and toks[k - 1].text in {".", ":"}):
            continue
        if toks[j].text == "[" and toks[j + 1].kind == "number" and toks[j + 2].text == "]":
            found.append((t.line, f"{t.text}..[{toks[j + 1].text}]"))
    return found


def declared_names(source: str) -> list[tuple[str, int]]:
    """(name, line) of every local, parameter and loop variable ``source`` declares."""
    toks = list(tokens(source))
    out: list[tuple[str, int]] = []

    def names_from(j: int, stop: frozenset[str]) -> None:
        while j < len(toks) and toks[j].text not in stop:
            if toks[j].kind == "name":
                out.append((toks[j].text, toks[j].line))
            elif toks[j].text != ",":
                return
            j += 1

    for k, t in enumerate(toks):
        if t.text == "local" and toks[k + 1].text == "function":
            out.append((toks[k + 2].text, toks[k + 2].line))
        elif t.text == "local":
            names_from(k + 1, frozenset({"="}))
        elif t.text == "for":
            names_from(k + 1, frozenset({"=", "in"}))
        elif t.text == "function":
            j = k + 1
            while toks[j].text != "(":
                j += 1
            names_from(j + 1, frozenset({")"}))
    return out
