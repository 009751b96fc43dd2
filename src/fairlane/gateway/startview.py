"""A job's start estimate as the gateway and the dashboard show it: the time as ISO
text and what it rests on as figures (``StartEstimateView``); its sentence is
``fairlane.insight.startestimate.start_text``, as explain says it.

The estimate itself is ``fairlane.app.startestimate`` (the rule and its error model:
``fairlane.policy.startpredict``); nothing here reads the store.
"""

from __future__ import annotations

from datetime import datetime

from fairlane.app.startestimate import StartEstimate
from fairlane.gateway.models import StartEstimateView

__all__ = ["estimate_view", "iso"]


def iso(when: datetime | None) -> str | None:
    """``when`` as ISO 8601 text (the gateway's times are aware, in UTC), or None."""
    return None if when is None else when.isoformat()


def estimate_view(est: StartEstimate) -> StartEstimateView:
    """The figures behind ``est``: each None where nothing can be said."""
    p = est.prediction
    known = est.at is not None
    return StartEstimateView(
        wait_seconds=est.wait_s if known else None,
        work_ahead_slot_seconds=p.work_ahead if p else None,
        slots=p.slots if p else None,
        share=p.share if p else None,
        jobs_ahead=p.ahead if p else None,
        tenants=p.tenants if p else None,
        expected_run_seconds=est.expected_run_s,
        why_none=None if known else (est.why_none or "nothing can be said"),
    )
