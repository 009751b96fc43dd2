"""Wire arrays the Lua builds by name, turned into list constructors when the library is
assembled.

The Lua writes a wire array as ``{[Row.ID] = id, [Row.TOKEN] = token, ..}``, each place
by its name; once the names are written in, the keys are ``[1]``, ``[2]`` ... In Lua 5.1
keys given so go to a table's hash part, one insertion each, where a list constructor
fills its array part in one go: ``{[1] = a, [2] = b}`` holds what ``{(a), (b)}`` holds
(the parentheses keep a call to one value, as a keyed field does), and costs less. So a
constructor whose keys are exactly ``1..n`` in order is rewritten as the list, and a
name costs the server nothing here either. Any other constructor is left as it is.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["as_lists"]

_OPEN: Final = re.compile(r"\{\s*\[1\]\s*=")
_KEYED: Final = re.compile(r"\s*\[(\d+)\]\s*=\s*(.*?)\s*", re.DOTALL)
_PAIRS: Final = {"(": ")", "[": "]", "{": "}"}


def _fields(source: str, start: int) -> tuple[list[str], int] | None:
    """The top-level fields of the constructor opening at ``start``, and the index just
    past its end; None when it holds a comment or a long string (left as written)."""
    fields: list[str] = []
    stack: list[str] = []
    field_start = start + 1
    i = start + 1
    while i < len(source):
        c = source[i]
        if c in "'\"":
            j = i + 1
            while source[j] != c:
                j += 2 if source[j] == "\\" else 1
            i = j + 1
            continue
        if source.startswith("--", i) or source.startswith("[[", i) or source.startswith("[=", i):
            return None
        if c in _PAIRS:
            stack.append(_PAIRS[c])
        elif stack and c == stack[-1]:
            stack.pop()
        elif not stack and c in ",}":
            fields.append(source[field_start:i])
            field_start = i + 1
            if c == "}":
                return fields, i + 1
        i += 1
    return None


def _as_list(fields: list[str]) -> str | None:
    values = []
    for place, text in enumerate((f for f in fields if f.strip()), 1):
        keyed = _KEYED.fullmatch(text)
        if keyed is None or int(keyed.group(1)) != place:
            return None
        values.append(f"({keyed.group(2)})")
    return "{" + ", ".join(values) + "}"


def as_lists(source: str) -> str:
    """``source`` with each constructor keyed ``[1]..[n]`` in order written as a list."""
    out: list[str] = []
    done = 0
    for opening in _OPEN.finditer(source):
        if opening.start() < done:
            continue
        found = _fields(source, opening.start())
        if found is None:
            continue
        fields, end = found
        listed = _as_list(fields)
        if listed is not None:
            out.append(source[done : opening.start()])
            # its lines kept, so that the lines after it keep their numbers in errors
            out.append(listed + "\n" * source.count("\n", opening.start(), end))
            done = end
    out.append(source[done:])
    return "".join(out)
