"""``fairlane.store.explain``, the path the README gave for ``explain(record, events)``:
it lives in ``fairlane.insight.explain`` now, and this name is kept for code that
imports it from here (new code imports ``fairlane.insight.explain``)."""

from fairlane.insight.explain import (
    Explanation,
    Segment,
    as_record,
    explain,
    format_ms,
    rate_keys_now,
    rate_now,
    rate_text,
    timeline,
)

__all__ = [
    "Explanation",
    "Segment",
    "as_record",
    "explain",
    "format_ms",
    "rate_keys_now",
    "rate_now",
    "rate_text",
    "timeline",
]
