"""Submitting the demo's workload on time, through admission, as a client would.

This module owns one run's submissions: :class:`Submitter` sends each arrival at its
time through ``task.submit`` (the fair run as the arrival's own tenant and class, the
FIFO run as one shared tenant in class ``standard``), records each admission answer
with the run's :class:`fairlane.demo.stats.Tracker`, and sends a rejected job again
after its Retry-After -- at most ``RESUBMISSIONS`` times, and only while the arrivals'
window lasts -- unless the rejection is final (too wide, or a deadline it cannot meet).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fairlane.app import App
from fairlane.demo.app import Mode
from fairlane.demo.stats import Tracked, Tracker
from fairlane.demo.workload import Arrival, Workload
from fairlane.policy.admission import Estimate

__all__ = ["FIFO_TENANT", "RESUBMISSIONS", "Submitter"]

#: the task of each kind of arrival
TASKS = {
    "agent": "demo.agent_step",
    "chat": "demo.chat",
    "summarise": "demo.summarise",
    "render": "demo.render",
    "research": "demo.research",
}
FIFO_TENANT = "shared"
RESUBMISSIONS = 2  # times a rejected job is submitted again after its Retry-After
_CALL_TIMEOUT = 10.0  # s: any one call to the server
_FINAL = frozenset({"too_wide", "deadline_unmeetable"})  # rejections a retry cannot change


def _estimate(arrival: Arrival) -> Estimate:
    return Estimate(
        input_tokens=arrival.input_tokens,
        max_output_tokens=arrival.output_tokens,
        tool_calls=max(0, len(arrival.waits) - 1),
    )


@dataclass
class Submitter:
    """One run's submissions of ``workload`` in ``mode``, answered into ``tracker``."""

    app: App
    mode: Mode
    tracker: Tracker

    async def submit_all(self, workload: Workload, t0: float, submitted: asyncio.Event) -> None:
        """Each arrival at its time (``t0`` on the loop's clock is the run's start); a
        rejected one again after its Retry-After, if the arrivals' window lasts that long."""
        loop = asyncio.get_running_loop()
        window_end = t0 + workload.window
        try:
            async with asyncio.TaskGroup() as retries:
                for arrival in workload.arrivals:
                    delay = t0 + arrival.at - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tracked = self.tracker.track(arrival)
                    await self._submit(tracked, retries, window_end, RESUBMISSIONS)
        finally:
            self.tracker.submitting = False
            submitted.set()

    async def _submit(
        self, tracked: Tracked, retries: asyncio.TaskGroup, window_end: float, tries_left: int
    ) -> None:
        arrival = tracked.arrival
        task = self.app.get_task(TASKS[arrival.kind])
        fair = self.mode == "fair"
        tenant = arrival.tenant if fair else FIFO_TENANT
        service_class = arrival.service_class if fair else "standard"
        async with asyncio.timeout(_CALL_TIMEOUT):
            if arrival.kind == "research":
                admission = await task.submit(
                    f"research run at {arrival.at:.1f} s",
                    list(arrival.waits),
                    tenant=tenant,
                    service_class=service_class,
                )
            else:
                admission = await task.submit(
                    list(arrival.waits),
                    arrival.fail_first,
                    arrival.input_tokens,
                    arrival.output_tokens,
                    tenant=tenant,
                    service_class=service_class,
                    estimate=_estimate(arrival),
                )
        self.tracker.answered(tracked, admission)
        if admission.job is not None:
            return
        again = asyncio.get_running_loop().time() + (admission.retry_after or 1.0)
        if tries_left <= 0 or admission.reason in _FINAL or again >= window_end:
            self.tracker.gave_up(tracked)
            return

        async def later() -> None:
            await asyncio.sleep(max(0.0, again - asyncio.get_running_loop().time()))
            await self._submit(tracked, retries, window_end, tries_left - 1)

        retries.create_task(later())
