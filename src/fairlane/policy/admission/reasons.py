"""Every reason an admission answer gives, named once.

The store counts each refusal with its reason (``fairlane_admission_decisions_total``),
the gateway labels its answers with it, and the README lists it; ``tests/docs`` holds
the README's list to :data:`COUNTED_REASONS`.
"""

from __future__ import annotations

from typing import Final, get_args

from fairlane.policy.admission.bounds import QueueReason
from fairlane.policy.admission.gate import Reason
from fairlane.policy.admission.memory import STORE_FULL

__all__ = [
    "CLASS_NOT_ENTITLED",
    "COUNTED_REASONS",
    "DEADLINE_UNMEETABLE",
    "REJECTION_REASONS",
    "SCRIPT_REASONS",
    "TENANT_PAUSED",
]

#: A restricted class the tenant is not entitled to (``fairlane.policy.classes``).
CLASS_NOT_ENTITLED: Final = "class_not_entitled"
#: A deadline already past, or one the job is not expected to meet (its estimated start
#: and learned length: ``fairlane.policy.startpredict``); retrying cannot help.
DEADLINE_UNMEETABLE: Final = "deadline_unmeetable"
#: An operator quarantined the tenant (``fairlane.policy.pauses``).
TENANT_PAUSED: Final = "tenant_paused"

#: Why the enqueue script refused a job: a pool's rules, a lane's default queue bounds,
#: entitlement.
SCRIPT_REASONS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys((*get_args(Reason), *get_args(QueueReason), CLASS_NOT_ENTITLED, TENANT_PAUSED))
)

#: Every reason a job is refused for: the script's, and ``store_full`` (the memory mark,
#: checked in the producer's process before the script runs).
REJECTION_REASONS: Final[tuple[str, ...]] = (*SCRIPT_REASONS, STORE_FULL)

#: What the store's decision counter carries as ``reason``: ``none`` for an accepted
#: job, the reason it waits for a deferred one, and every refusal the script makes
#: (``store_full`` is never written: the store had no room, or was never asked).
COUNTED_REASONS: Final[tuple[str, ...]] = ("none", *SCRIPT_REASONS)
