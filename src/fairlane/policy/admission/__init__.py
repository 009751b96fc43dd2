"""Admission: what a job is expected to cost, and whether a pool takes it now.

This package owns the reference rules of the admission gate; the Lua store carries out
the same rules (``lua/admission.lua``, ``admit_deferred`` and ``readmit_class`` in
``lua/records.lua``).
Their shared contract is ``docs/contracts/admission.md`` (the decision's rules 1-5 are
cited by number here and in the scripts); ``tests/store/test_admission_vs_policy.py``
and ``tests/store/test_costs_lua.py`` hold the two to it. It is pure: no I/O, no clock
(times are int milliseconds passed in), no randomness (draws passed in).

By concern:

* ``units``: milli-units (``to_milli``) and the checks every setting passes;
* ``cost``: estimates and work units, the learned cost, the reservation and its bound,
  the charge in cost mode;
* ``gate``: the pool, its state, the decision on one submission (rules 1-5) and the
  FIFO drain of deferred queues (the baseline);
* ``deferral``: fair deferral, the order a class's deferred jobs are admitted again
  (per-tenant groups FIFO, tenants by weighted start-time fair tags, no head-of-line
  blocking across tenants, the pinned head's overtake bound, a bounded pass);
* ``rejections``: the Retry-After a rejected client is told;
* ``bounds``: the default bounds on queued jobs of a lane without a pool;
* ``memory``: the store's memory mark, above which new jobs are refused ``store_full``.

Every name is importable from ``fairlane.policy.admission`` itself.
"""

from __future__ import annotations

from fairlane.policy.admission.bounds import (
    DEFAULT_LANE_MAX_QUEUED,
    DEFAULT_TENANT_MAX_QUEUED,
    LANE_READ_EVERY,
    QueueBounds,
    QueueCounts,
    QueuedJob,
    QueueReason,
    admit_batch,
    queue_refusal,
    reads_lane,
)
from fairlane.policy.admission.cost import (
    MAX_TOKENS,
    MAX_TOOL_CALLS,
    MAX_TOOL_SECONDS,
    MIN_CHARGE_MILLI,
    Coefficients,
    Estimate,
    EstimationSettings,
    LearnedCost,
    charge_milli,
    reservation_units,
    too_wide,
    work_units,
)
from fairlane.policy.admission.deferral import (
    OVERTAKE_LIMIT,
    PASS_BUDGET,
    DeferredQueue,
    Readmission,
    Verdict,
    charge_units,
)
from fairlane.policy.admission.gate import (
    AdmissionClass,
    Decision,
    DeferredJob,
    FullReason,
    PoolConfig,
    PoolState,
    Reason,
    WhenFull,
    decide,
    drain,
    fits,
    unit_table,
)
from fairlane.policy.admission.memory import (
    DEFAULT_MEMORY_MARK,
    STORE_FULL,
    MemoryReading,
    StoreFullReason,
    check_mark,
    reading_due,
    store_full,
    store_full_retry_after,
)
from fairlane.policy.admission.rejections import RetryAfterPolicy, retry_after
from fairlane.policy.admission.units import to_milli

__all__ = [
    "DEFAULT_LANE_MAX_QUEUED",
    "DEFAULT_MEMORY_MARK",
    "DEFAULT_TENANT_MAX_QUEUED",
    "LANE_READ_EVERY",
    "MAX_TOKENS",
    "MAX_TOOL_CALLS",
    "MAX_TOOL_SECONDS",
    "MIN_CHARGE_MILLI",
    "OVERTAKE_LIMIT",
    "PASS_BUDGET",
    "STORE_FULL",
    "AdmissionClass",
    "Coefficients",
    "Decision",
    "DeferredJob",
    "DeferredQueue",
    "Estimate",
    "EstimationSettings",
    "FullReason",
    "LearnedCost",
    "MemoryReading",
    "PoolConfig",
    "PoolState",
    "QueueBounds",
    "QueueCounts",
    "QueueReason",
    "QueuedJob",
    "Readmission",
    "Reason",
    "RetryAfterPolicy",
    "StoreFullReason",
    "Verdict",
    "WhenFull",
    "admit_batch",
    "charge_milli",
    "charge_units",
    "check_mark",
    "decide",
    "drain",
    "fits",
    "queue_refusal",
    "reading_due",
    "reads_lane",
    "reservation_units",
    "retry_after",
    "store_full",
    "store_full_retry_after",
    "to_milli",
    "too_wide",
    "unit_table",
    "work_units",
]
