"""Learned job lengths and the one read a start-time estimate takes
(``store/lua/estimate.lua``; the rule is ``fairlane.policy.startpredict``).

A learned mean is named by a field; those of one tenant name it last and live in the
tenant's own hash ``dur:<tenant>`` (without its name: the tenant sweep forgets the
hash with the tenant's other state), the others in the shard's ``dur``
(:func:`stored_at` says where, as the scripts' ``place`` does):

- ``t\\0<lane>\\0<class>\\0<tenant>``: slot-ms per job of a tenant's jobs in a class;
- ``c\\0<lane>\\0<class>``: the same over every tenant of the class;
- ``u\\0<lane>\\0<class>\\0<tenant>``: units a tenant's job in a class is charged, in a
  lane that charges by cost;
- ``k\\0<task>\\0<tenant>``: ms of an attempt of a task, for one tenant;
- ``k\\0<task>``: the same over every tenant.

Beside them the scripts keep what a tenant's jobs in a class (``w``, in its hash) and a
class's (``uc``) used in the last whole window. Workers fold what their attempts took
into them (``runtime/durations.py``), a batch per shard every few seconds, so no job's
own calls write anything for them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from fairlane.policy.startpredict import (
    DURATION_ALPHA,
    MAX_TENANTS,
    Backlog,
    ClassLoad,
    Situation,
)
from fairlane.store.argv import EstimateArg, LearnArg, argv
from fairlane.store.base import StoreBase
from fairlane.store.keys import AppKeys
from fairlane.store.wire import ClassField, EstimateReply, at

__all__ = [
    "DurationCalls",
    "Estimated",
    "charge_field",
    "class_field",
    "stored_at",
    "task_field",
    "tenant_field",
]


#: the parts before the tenant's name in a tenant's own fields, by kind
_TENANT_AT = {"t": 3, "u": 3, "k": 2}


def stored_at(keys: AppKeys, field: str) -> tuple[str, str]:
    """The key and field a learned mean's field is kept under (the scripts' ``place``)."""
    parts = field.split("\0")
    at = _TENANT_AT.get(field[:1])
    if at is not None and len(parts) == at + 1:
        return keys.tenant_durations(parts[at]), "\0".join(parts[:at])
    return keys.durations, field


def tenant_field(lane: str, cls: str, tenant: str) -> str:
    return f"t\0{lane}\0{cls}\0{tenant}"


def charge_field(lane: str, cls: str, tenant: str) -> str:
    return f"u\0{lane}\0{cls}\0{tenant}"


def class_field(lane: str, cls: str) -> str:
    return f"c\0{lane}\0{cls}"


def task_field(task: str, tenant: str | None = None) -> str:
    return f"k\0{task}" if tenant is None else f"k\0{task}\0{tenant}"


class Estimated(msgspec.Struct, frozen=True):
    """What the store said of a job, for its start-time estimate."""

    now_ms: int
    state: str  # '' when the job is not known; 'new' for one not yet submitted
    tenant: str = ""
    lane: str = ""
    cls: str = ""
    task: str = ""
    situation: Situation | None = None  # None: it is not waiting in a queue
    own_ms: float | None = None  # its own expected length
    deadline_ms: int | None = None
    run_at_ms: int | None = None
    paused: bool = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: Any) -> float | None:
    text = _text(value) if value is not None else ""
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _loads(table: list[Any], loads: list[Any]) -> tuple[ClassLoad, ...]:
    out = []
    for i, row in enumerate(table):
        out.append(
            ClassLoad(
                name=str(row[ClassField.NAME - 1]),
                share=float(row[ClassField.SHARE - 1]),
                min_slots=int(row[ClassField.MIN_SLOTS - 1]),
                batch=bool(row[ClassField.BATCH - 1]),
                in_flight=int(loads[2 * i]) if 2 * i < len(loads) else 0,
                waiting=int(loads[2 * i + 1]) if 2 * i + 1 < len(loads) else 0,
            )
        )
    return tuple(out)


def _backlogs(flat: list[Any], use: list[Any]) -> tuple[Backlog, ...]:
    out = []
    for k, i in enumerate(range(0, len(flat) - 4, 5)):
        mean = _number(flat[i + 3])
        out.append(
            Backlog(
                tenant=_text(flat[i]),
                weight=_number(flat[i + 1]) or 1.0,
                jobs=int(flat[i + 2]),
                slot_seconds=(mean or 0.0) / 1000,
                use=(_number(use[k]) or 0.0) if k < len(use) else 0.0,
                charge=_number(flat[i + 4]) or 0.0,
            )
        )
    return tuple(out)


def parse_estimate(reply: Sequence[Any]) -> Estimated:
    """``estimate``'s reply as an :class:`Estimated`."""
    values = list(reply) + [None] * (len(EstimateReply) - len(reply))
    state = _text(at(values, EstimateReply.STATE) or "")
    now = int(at(values, EstimateReply.NOW))
    if not state:
        return Estimated(now, "")
    deadline = _number(at(values, EstimateReply.DEADLINE))
    run_at = _number(at(values, EstimateReply.RUN_AT))
    own = _number(at(values, EstimateReply.OWN_MS))
    names = {
        "tenant": _text(at(values, EstimateReply.TENANT) or ""),
        "lane": _text(at(values, EstimateReply.LANE) or ""),
        "cls": _text(at(values, EstimateReply.CLASS) or ""),
        "task": _text(at(values, EstimateReply.TASK) or ""),
    }
    ahead = at(values, EstimateReply.AHEAD)
    situation = None
    use = list(at(values, EstimateReply.USAGE) or [])
    if ahead is not None and int(ahead) >= 0:
        class_mean = _number(at(values, EstimateReply.CLASS_MEAN))
        situation = Situation(
            capacity=int(at(values, EstimateReply.CAPACITY) or 0),
            classes=_loads(
                json.loads(_text(at(values, EstimateReply.TABLE))),
                list(at(values, EstimateReply.LOADS) or []),
            ),
            cls=names["cls"],
            tenant=names["tenant"],
            ahead=int(ahead),
            backlogs=_with_own(
                _backlogs(list(at(values, EstimateReply.TENANTS) or []), use), names["tenant"]
            ),
            class_use=(_number(use[-1]) or 0.0) if use else 0.0,
            charge_by_cost=_text(at(values, EstimateReply.CHARGE) or "") == "cost",
            unread=int(at(values, EstimateReply.UNREAD) or 0),
            class_slot_seconds=None if class_mean is None else class_mean / 1000,
        )
    return Estimated(
        now_ms=now,
        state=state,
        situation=situation,
        own_ms=own,
        deadline_ms=None if deadline is None else int(deadline),
        run_at_ms=None if run_at is None else int(run_at),
        paused=int(at(values, EstimateReply.PAUSED) or 0) == 1,
        **names,
    )


def _with_own(backlogs: tuple[Backlog, ...], tenant: str) -> tuple[Backlog, ...]:
    """The waiting tenants with the job's own among them: a tenant with nothing waiting
    yet (its first job not submitted) is not in its class's fair set."""
    if any(b.tenant == tenant for b in backlogs):
        return backlogs
    return (*backlogs, Backlog(tenant, 1.0, 0, 0.0))


class DurationCalls(StoreBase):
    """Learned lengths, and the read behind a start-time estimate, on one shard."""

    async def learn_durations(self, entries: Sequence[tuple[str, int, float]]) -> int:
        """Fold ``(field, attempts, their sum in ms)`` into the learned means; returns
        the fields written."""
        tail: list[Any] = []
        for field, count, total in entries:
            tail.extend((field, count, f"{total:.3f}"))
        if not tail:
            return 0
        raw = await self.fcall(
            "learn_durations", self._common, argv(LearnArg, *tail, alpha=DURATION_ALPHA)
        )
        return int(raw)

    async def estimate_job(self, job_id: str, *, max_tenants: int = MAX_TENANTS) -> Estimated:
        """What the store holds for an estimate of job ``job_id``: one call."""
        return await self._estimate(
            job=job_id, tenant="", lane="", cls="", task="", max_tenants=max_tenants, before=""
        )

    async def estimate_new(
        self,
        *,
        tenant: str,
        lane: str,
        cls: str,
        task: str,
        max_tenants: int = MAX_TENANTS,
        before: float | None = None,
    ) -> Estimated:
        """The same for a job of these names, as if submitted now: behind the jobs of its
        tenant's queue whose score is below ``before`` (the score it would take), or at
        the queue's end."""
        return await self._estimate(
            job="",
            tenant=tenant,
            lane=lane,
            cls=cls,
            task=task,
            max_tenants=max_tenants,
            before="" if before is None else f"{before:.0f}",
        )

    async def _estimate(
        self,
        *,
        job: str,
        tenant: str,
        lane: str,
        cls: str,
        task: str,
        max_tenants: int,
        before: str,
    ) -> Estimated:
        # ``class`` is a keyword in Python: that argument is named in a mapping
        names = {"class": cls}
        args = argv(
            EstimateArg,
            job=job,
            tenant=tenant,
            lane=lane,
            task=task,
            max_tenants=max_tenants,
            before=before,
            **names,
        )
        raw = await self.fcall("estimate", self._common, args)
        return parse_estimate(raw)
