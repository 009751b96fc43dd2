"""Every reason an admission answer gives, named once.

The store counts each refusal with its reason (``fairlane_admission_decisions_total``),
the gateway labels its answers with it, and the README lists it; ``tests/docs`` holds
the README's list to :data:`COUNTED_REASONS`.
"""

from __future__ import annotations

from typing import Final, get_args

from fairlane.policy.admission.bounds import QueueReason
from fairlane.policy.admission.gate import Reason

__all__ = ["CLASS_NOT_ENTITLED", "COUNTED_REASONS", "REJECTION_REASONS"]

#: A restricted class the tenant is not entitled to (``fairlane.policy.classes``).
CLASS_NOT_ENTITLED: Final = "class_not_entitled"

#: Why a job was refused: a pool's rules, a lane's default queue bounds, entitlement.
REJECTION_REASONS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys((*get_args(Reason), *get_args(QueueReason), CLASS_NOT_ENTITLED))
)

#: What the store's decision counter carries as ``reason``: ``none`` for an accepted
#: job, the reason it waits for a deferred one, and every refusal's own.
COUNTED_REASONS: Final[tuple[str, ...]] = ("none", *REJECTION_REASONS)
