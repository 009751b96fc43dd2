"""How an app prices work: a declared estimate in milli-units, whose learned cost
applies, and how long a rejected caller is told to wait.

The prices come from the app's config (``[coefficients]``, ``[estimation]`` and
``[retry]``); the store reserves what they say, and the worker prices what an
attempt used with the same coefficients.
"""

from __future__ import annotations

import math
import random

import msgspec

from fairlane.policy.admission import (
    Coefficients,
    Estimate,
    EstimationSettings,
    RetryAfterPolicy,
    retry_after,
    store_full_retry_after,
    to_milli,
)
from fairlane.store.keys import cost_key_name

__all__ = ["Pricing", "cost_key"]


class Pricing(msgspec.Struct, frozen=True):
    """How a declared estimate becomes the milli-units the store reserves."""

    coefficients: Coefficients = msgspec.field(default_factory=Coefficients)
    estimation: EstimationSettings = msgspec.field(default_factory=EstimationSettings)
    retry: RetryAfterPolicy = msgspec.field(default_factory=RetryAfterPolicy)

    def declared_milli(self, estimate: Estimate | float | None) -> int:
        """The caller's declared cost in milli-units (the store raises it to what this
        tenant's jobs were learned to cost, then applies the safety multiplier)."""
        if estimate is None:
            return to_milli(self.estimation.default_units)
        if isinstance(estimate, Estimate):
            return to_milli(estimate.units(self.coefficients))
        if isinstance(estimate, bool) or not isinstance(estimate, int | float):
            raise TypeError(f"estimate must be an Estimate or a number of units, got {estimate!r}")
        if not math.isfinite(estimate) or estimate < 0:
            raise ValueError(f"estimate must be a finite number of units >= 0, got {estimate!r}")
        return to_milli(float(estimate))

    def retry_after(self, earlier_rejections: int) -> float:
        """Seconds a rejected caller should wait: growing with the tenant's recent
        rejections, jittered here so that callers refused together do not return together."""
        return retry_after(earlier_rejections, random.random(), self.retry)

    def full_retry_after(self, depth: float) -> float:
        """Seconds a caller refused ``store_full`` should wait, the server being
        ``depth`` of the way from its memory mark to its limit; jittered here too."""
        return store_full_retry_after(depth, random.random(), self.retry)


def cost_key(tenant: str, task: str, estimate: Estimate | float | None) -> str:
    """Whose learned cost applies: the tenant, the workflow (the task unless the estimate
    names one) and the model."""
    workflow = task
    model = ""
    if isinstance(estimate, Estimate):
        workflow = estimate.workflow or task
        model = estimate.model or ""
    return cost_key_name(tenant, workflow, model)
