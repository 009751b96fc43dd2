"""A class's starts by the second, as ``explain`` reads them for a job.

The ring is ``lane:<l>:c:<c>:starts`` (``fairlane.store.keys``): a field per second of
the server's clock holding that second's starts and retry starts in one integer
(``fairlane.policy.starts``). One round trip: the whole hash (at most
``BUCKETS + 1`` fields) and the clock of the node that holds it, so that a reader can
tell which of a job's seconds the ring still keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fairlane.store.fields import field_int
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd, server_time

__all__ = ["ClassStarts", "class_starts"]


@dataclass(frozen=True, slots=True)
class ClassStarts:
    """A class's ring of starts: bucket (seconds since the epoch) -> its packed count
    (``fairlane.policy.starts.unpack``), read at server time ``now_ms``."""

    lane: str = ""
    service_class: str = ""
    buckets: Mapping[int, int] = field(default_factory=dict)
    now_ms: int = 0


def class_starts(keys: AppKeys, lane: str, service_class: str) -> Plan[ClassStarts]:
    """The ring of starts of ``lane``'s class ``service_class`` in the shard of ``keys``."""
    key = keys.class_key(lane, service_class, "starts")
    raw, now = yield [cmd("hgetall", key), server_time(key)]
    buckets: dict[int, int] = {}
    for name, value in (raw or {}).items():
        index, count = field_int(name), field_int(value)
        if index is not None and count is not None:
            buckets[index] = count
    return ClassStarts(lane, service_class, buckets, int(now))
