"""What the dashboard changes: cancel, retry and re-drive jobs, one or many.

Every action goes through the app's own calls, never a script of its own:

- ``cancel``: the store's cancel (as ``fairlane job cancel``): a waiting job at once,
  a running one at its worker's next lease renewal;
- ``redrive``: ``App.redrive`` (as ``fairlane dead redrive``): a dead letter goes back
  to its queue, same id, with a fresh attempt budget;
- ``retry``: a finished job that is not a dead letter (cancelled, expired, or failed
  and no longer in the dead set) is submitted again as a new job of the same task,
  tenant, arguments, class and priority, through admission and the app's
  ``durability`` like any submission (``accepted:not_acknowledged`` when the
  replicas or the AOF did not confirm it in time).

A bulk action applies to the jobs a filter matches, at most ``BULK_MAX`` of them; the
caller first asks how many (``dry_run``) and must then confirm that count.

In an app split into scheduling shards, a job is acted on in the shard its id names
(``App.store_for_job``), and a retry is submitted to its tenant's shard.
"""

from __future__ import annotations

from typing import Any

from fairlane.app import App
from fairlane.app.job import TERMINAL
from fairlane.gateway.ui.jobs import Filter, find_jobs
from fairlane.registry import CallOptions
from fairlane.store.records import JobRecord
from fairlane.store.wire import StoreUnavailable

__all__ = ["BULK_MAX", "applies", "bulk", "cancel", "redrive", "retry"]

BULK_MAX = 500


def applies(action: str, row: dict[str, Any]) -> bool:
    """Whether ``action`` can change a job in the state ``row`` (a listing row) shows."""
    if action == "cancel":
        return row["status"] not in TERMINAL
    if action == "redrive":
        return bool(row["state"] == "dead")
    return row["status"] in TERMINAL - {"completed"} and row["state"] != "dead"


async def cancel(app: App, job_id: str) -> str:
    """The job's status after the request (``missing`` when there is no such job)."""
    return await app.store_for_job(job_id).cancel(job_id)


async def redrive(app: App, job_ids: list[str]) -> list[str]:
    """The ids sent back (a job that is not a dead letter is left alone)."""
    return await app.redrive(job_ids) if job_ids else []


async def retry(app: App, job_id: str) -> tuple[str, str | None]:
    """Submit a copy of a finished job: ``(outcome, new id)``; outcome is ``accepted``,
    ``deferred``, ``rejected:<reason>``, ``unknown_task`` or ``not_finished``."""
    record = await app.store_for_job(job_id).read_job(job_id) or JobRecord(job_id)
    if record.status not in TERMINAL - {"completed"}:
        return "not_finished", None
    task = app.tasks.get(record.task)
    if task is None:
        return "unknown_task", None
    new = task.new_job(
        record.args or b"[[],{}]",
        CallOptions(
            tenant=record.tenant, priority=record.priority, service_class=record.service_class
        ),
    )
    # through admission and the app's durability, as any submission
    admission = await task.submit_job(new)
    if admission.status == "unavailable":
        raise StoreUnavailable("the store cannot be reached; nothing was retried")
    if admission.job is None:
        return f"rejected:{admission.reason}", None
    ack = admission.acknowledgement
    short = ":not_acknowledged" if ack is not None and not ack.met else ""
    return admission.status + short, admission.job.id


async def one(app: App, action: str, job_id: str) -> dict[str, Any]:
    """Apply ``action`` to one job; the answer names what happened."""
    if action == "cancel":
        return {"id": job_id, "result": await cancel(app, job_id)}
    if action == "redrive":
        moved = await redrive(app, [job_id])
        return {"id": job_id, "result": "redriven" if moved else "not_dead"}
    outcome, new_id = await retry(app, job_id)
    return {"id": job_id, "result": outcome, "new_id": new_id}


async def bulk(
    app: App, action: str, flt: Filter, *, limit: int, confirm: int | None
) -> dict[str, Any]:
    """Apply ``action`` to the jobs ``flt`` matches that it can change, at most ``limit``.

    Without ``confirm`` nothing is done: the answer is how many jobs it would touch. With
    it, the action runs only if the count is still ``confirm`` (else 409 by the caller)."""
    found = await find_jobs(app, flt, BULK_MAX)
    targets = [r["id"] for r in found["jobs"] if applies(action, r)][:limit]
    answer: dict[str, Any] = {"action": action, "count": len(targets), "done": False}
    if confirm is None or confirm != len(targets):
        return answer
    if action == "redrive":
        results = [{"id": i, "result": "redriven"} for i in await redrive(app, targets)]
    else:
        results = [await one(app, action, job_id) for job_id in targets]
    return {**answer, "done": True, "results": results}
