"""A job's rate keys in words: a rate, what a key says now, and the rows the faces show."""

from __future__ import annotations

from typing import Any

from fairlane.insight.words import format_ms
from fairlane.policy.rates import Rate
from fairlane.store.views.rates import JobRates, RateKeyView

__all__ = ["rate_keys_now", "rate_now", "rate_text"]


def _number(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) and abs(x) >= 1000 else f"{x:g}"


def rate_text(rate: Rate) -> str:
    """A rate as people read it: ``2 per 1 s, burst 2``; ``90,000 units per 60 s, ...``."""
    what = " units" if rate.units else ""
    return f"{_number(rate.limit)}{what} per {_number(rate.per)} s, burst {_number(rate.capacity)}"


def _later(at: int, now: int) -> str:
    return "now" if at <= now else f"in {format_ms(at - now)}"


def rate_now(view: RateKeyView, cost: float = 1.0) -> str:
    """What a rate key says now to a job of ``cost`` waiting on it: a pause and its
    cause, when its next tokens are due; '' when nothing holds it."""
    parts: list[str] = []
    if view.paused and view.paused_until_ms is not None:
        cause = f" ({view.pause_cause})" if view.pause_cause else ""
        parts.append(
            f"the key is paused{cause} for {format_ms(view.paused_until_ms - view.now_ms)} more"
        )
    due = view.due_ms if view.due_ms is not None else view.next_tokens_ms(cost)
    if due is not None and due > view.now_ms:
        parts.append(f"its next tokens are due {_later(due, view.now_ms)}")
    return ", ".join(parts)


def rate_keys_now(rates: JobRates) -> list[dict[str, Any]]:
    """A job's rate and adaptive keys with their state now, as plain values (the
    command line's JSON and the dashboard's job detail): its rate, its cost on it, the
    key's tokens, pause, cause and due time, an adaptive key's limit and bounds, and a
    sentence."""
    rows: list[dict[str, Any]] = []
    for key in sorted({*rates.rates, *rates.adaptive}):
        rate, view, bounds = rates.rates.get(key), rates.keys.get(key), rates.adaptive.get(key)
        cost = rates.cost(key) if rate is not None else None
        parts = [rate_text(rate)] if rate is not None else []
        limit = view.adaptive_limit if view is not None else None
        if bounds is not None:
            limit = limit if limit is not None else bounds.max
            parts.append(f"adaptive limit {limit} in [{bounds.min}, {bounds.max}]")
        if view is not None and view.tokens is not None and rate is not None:
            parts.append(f"{view.tokens:.2f} tokens now")
        told = rate_now(view, cost or 1.0) if view is not None and rate is not None else ""
        rows.append(
            {
                "key": key,
                "rate": None
                if rate is None
                else {
                    "limit": rate.limit,
                    "per": rate.per,
                    "burst": rate.capacity,
                    "cost": rate.cost,
                },
                "cost": cost,
                "tokens": view.tokens if view is not None else None,
                "paused_until_ms": view.paused_until_ms if view is not None else None,
                "pause_cause": view.pause_cause if view is not None else "",
                "due_ms": view.due_ms if view is not None else None,
                "adaptive": None
                if bounds is None
                else {"limit": limit, "max": bounds.max, "min": bounds.min},
                "text": f"key {key}: " + "; ".join(parts) + (f"; {told}" if told else ""),
            }
        )
    return rows
