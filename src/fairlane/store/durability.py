"""Acknowledged enqueues: WAIT and WAITAOF after the enqueue script, on its connection.

An enqueue is acknowledged by the primary once the script has run: it is in the
primary's memory, and in its AOF within a second under ``appendfsync everysec``. A
user who needs more asks for it with ``DurabilitySettings``: ``replicas=N`` sends
``WAIT N timeout`` (N replicas have received the write), ``aof=True`` sends
``WAITAOF 1 N timeout`` (the primary's AOF, and N replicas' AOFs, are fsynced).
Both count only the writes of the connection they are sent on, so the enqueue and
the wait travel together in one pipeline. The answer is an :class:`Acknowledgement`;
one that fell short of the request says so (``met`` is False) and the caller reports
it: the job is stored on the primary, but a failover or crash may still lose it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from fairlane.store.connection import is_cluster
from fairlane.store.redis import NewJob, Submitted, parse_submitted

if TYPE_CHECKING:
    from fairlane.config import DurabilitySettings
    from fairlane.store.redis import Store

__all__ = ["Acknowledgement", "submit_acknowledged"]


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """What the server confirmed about an enqueue's write, against what was asked."""

    replicas: int
    """Replicas that acknowledged the write (for ``aof``: that fsynced it)."""
    local: bool
    """The primary fsynced it to its AOF (asked only with ``aof``)."""
    wanted_replicas: int
    wanted_local: bool
    error: str | None = None
    """Why the server would not wait (e.g. WAITAOF with the AOF off), if it refused."""

    @property
    def met(self) -> bool:
        """Whether everything asked for was confirmed."""
        return (
            self.error is None
            and self.replicas >= self.wanted_replicas
            and (self.local or not self.wanted_local)
        )

    def describe(self) -> str:
        if self.error is not None:
            return f"the server did not wait: {self.error}"
        asked = f"{self.wanted_replicas} replica(s)" + (
            " and the local AOF" if self.wanted_local else ""
        )
        got = f"{self.replicas} replica(s)" + (
            (" and the local AOF" if self.local else " without the local AOF")
            if self.wanted_local
            else ""
        )
        return f"asked for {asked}, confirmed by {got}"


def _wait_command(durability: DurabilitySettings) -> tuple[Any, ...]:
    timeout_ms = max(1, round(durability.timeout * 1000))  # 0 would wait forever
    if durability.aof:
        return ("WAITAOF", 1, durability.replicas, timeout_ms)
    return ("WAIT", durability.replicas, timeout_ms)


def _acknowledgement(reply: Any, durability: DurabilitySettings) -> Acknowledgement:
    wanted = (durability.replicas, durability.aof)
    if isinstance(reply, ResponseError):
        return Acknowledgement(0, False, *wanted, error=str(reply))
    if durability.aof:
        local, replicas = reply
        return Acknowledgement(int(replicas), int(local) >= 1, *wanted)
    return Acknowledgement(int(reply), False, *wanted)


async def submit_acknowledged(
    store: Store, lane: str, jobs: Sequence[NewJob], durability: DurabilitySettings
) -> tuple[list[Submitted], Acknowledgement]:
    """``store.submit``, then wait (bounded by ``durability.timeout``) for the write to
    reach what ``durability`` asks; ``StoreUnavailable`` as for any call."""
    if is_cluster(store.blocking):
        # WAIT names no key: a cluster pipeline cannot put it on the enqueue's connection
        raise ValueError("durability (WAIT/WAITAOF) is not supported on a Redis Cluster yet")
    jobs = await store.prepare(jobs)  # large arguments go to the payload store first
    call = store.enqueue_call(lane, jobs)
    wait = _wait_command(durability)

    async def send() -> list[Any]:
        pipe = store.blocking.pipeline(transaction=False)
        pipe.execute_command("FCALL", *call)
        pipe.execute_command(*wait)
        return list(await pipe.execute(raise_on_error=False))

    for attempt in range(2):
        enqueued, waited = await store.blocking_call(durability.timeout, send)
        if isinstance(enqueued, ResponseError):
            # a server restarted without its data has lost the library too: nothing
            # was enqueued, so load it and send the whole call again, once
            if attempt == 0 and "Function not found" in str(enqueued):
                await store.load_library()
                continue
            raise enqueued
        return parse_submitted(enqueued), _acknowledgement(waited, durability)
    raise AssertionError("unreachable")  # pragma: no cover
