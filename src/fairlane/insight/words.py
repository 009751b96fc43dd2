"""Durations, dispatch's view of a wait and an attempt's own time, in words, for the
answers of ``explain``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fairlane.store.fields import field_int, field_text

__all__ = ["Why", "attempt_time", "format_ms", "queued_why", "reported_calls"]


def format_ms(ms: int) -> str:
    """A duration as people read it: ``12 ms``, ``4.2 s``, ``3.5 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def reported_calls(model_ms: int, tool_ms: int) -> str:
    """What an attempt reported of its time: ``38.2 s in model and tool calls it reported
    (30.1 s model, 8.1 s tools)``, or the one kind it reported."""
    if model_ms and tool_ms:
        both = f"{format_ms(model_ms)} model, {format_ms(tool_ms)} tools"
        return f"{format_ms(model_ms + tool_ms)} in model and tool calls it reported ({both})"
    if tool_ms:
        return f"{format_ms(tool_ms)} in tool calls it reported"
    return f"{format_ms(model_ms)} in model calls it reported"


def attempt_time(ran_ms: int, reported: tuple[int, int], *, still: bool = False) -> str:
    """How long an attempt ran and how much of it the task reported in model and tool
    calls. Calls made side by side may report more than the attempt ran: said so."""
    model_ms, tool_ms = reported
    ran = f"ran {format_ms(ran_ms)}" + (" so far" if still else "")
    if model_ms + tool_ms <= ran_ms:
        return f"{ran}, of which {reported_calls(model_ms, tool_ms)}"
    calls = reported_calls(model_ms, tool_ms)
    return f"{ran}, and {calls}: more than it ran, its calls overlapping"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _names(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True, slots=True)
class Why:
    why: str
    cause: str
    about: tuple[str, ...] = ()


def queued_why(qw: Any, cls: str) -> Why | None:
    """Dispatch's ``qw`` view of a wait in words, or None when it says nothing."""
    text = field_text(qw)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    by = data.get("by") if isinstance(data.get("by"), dict) else {}
    rivals = field_int(data.get("ten")) or 0
    parts: list[str] = []
    borrowers: list[str] = []
    if by:
        shown = []
        for name in sorted(by):
            held = by[name] if isinstance(by[name], list) and len(by[name]) == 2 else ["?", "?"]
            borrowers.append(name)
            shown.append(f"{name} (holding {held[0]} slots, its share {held[1]})")
        who = f"class {shown[0]} was" if len(shown) == 1 else f"classes {_names(shown)} were"
        parts.append(f"waited for capacity in class {cls} while {who} borrowing")
    if rivals > 0:
        tenants = _plural(rivals, "other tenant", "other tenants")
        if parts:
            parts.append(f"fair dispatch shared it with {tenants}")
        else:
            parts.append(
                f"queued behind other tenants' work in class {cls} "
                f"(fair dispatch shared it with {tenants})"
            )
    if not parts:
        return None
    return Why(", and ".join(parts), "class" if borrowers else "tenants", tuple(borrowers))
