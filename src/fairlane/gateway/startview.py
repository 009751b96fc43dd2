"""A job's start estimate as the gateway and the dashboard show it: the time as ISO
text, what it rests on as figures (``StartEstimateView``), and one line of words.

The estimate itself is ``fairlane.app.startestimate`` (the rule and its error model:
``fairlane.policy.startpredict``); nothing here reads the store.
"""

from __future__ import annotations

from datetime import datetime

from fairlane.app.startestimate import StartEstimate
from fairlane.gateway.models import StartEstimateView

__all__ = ["estimate_line", "estimate_view", "iso"]


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


def _about(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"about {round(seconds)} s"
    if seconds < 7200:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def estimate_line(est: StartEstimate) -> str:
    """One line for a person: when the job is expected to start and why, or why nothing
    can be said."""
    if est.at is None or est.wait_s is None:
        return f"no start estimate: {est.why_none or 'nothing can be said'}"
    head = f"expected to start in {_about(est.wait_s)} (an estimate)"
    basis = []
    p = est.prediction
    if p is not None:
        basis += [
            f"{p.work_ahead:.3g} slot-seconds of work before it on its class's "
            f"{p.slots:.3g} slot{'' if p.slots == 1 else 's'}",
            f"its tenant's share of the class's starts {p.share:.0%}",
            _count(p.ahead, "job", "jobs") + " of its tenant ahead of it",
            _count(p.tenants, "tenant", "tenants") + " waiting",
        ]
    if est.expected_run_s is not None:
        basis.append(f"it is expected to run {_about(est.expected_run_s)}")
    return f"{head}: {'; '.join(basis)}" if basis else head
