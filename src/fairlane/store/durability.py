"""Acknowledged enqueues: WAIT and WAITAOF after the enqueue script, on its connection.

An enqueue is acknowledged by the primary once the script has run: it is in the
primary's memory, and in its AOF within a second under ``appendfsync everysec``. A
user who needs more asks for it with ``DurabilitySettings``: ``replicas=N`` sends
``WAIT N timeout`` (N replicas have received the write), ``aof=True`` sends
``WAITAOF 1 N timeout`` (the primary's AOF, and N replicas' AOFs, are fsynced).
Both count only the writes of the connection they are sent on, so the enqueue and
the wait travel together in one pipeline. The answer is an :class:`Acknowledgement`;
one that fell short of the request says so (``met`` is False) and the caller reports
it, raising :class:`NotAcknowledged`: the job is stored on the primary, but a failover
or crash may still lose it.

On a Redis Cluster the pipeline goes to the primary holding the app's slot (every key
of the script shares it), on a connection of its own to that node: WAIT names no key,
so the cluster client could not route it after the script. The guarantee is that
primary's: ``replicas`` counts its replicas only, and a cluster without replicas
answers ``replicas=0`` (``met`` False whenever replicas were asked). A slot that moved
between the routing and the call fails the enqueue with ``StoreUnavailable``; the
script did not run there, so nothing was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError

from fairlane.errors import FairlaneError
from fairlane.store.connection import is_cluster, slot_client
from fairlane.store.memory import out_of_memory, server_full
from fairlane.store.wire import NewJob, StoreUnavailable, Submitted, parse_submitted

if TYPE_CHECKING:
    from fairlane.config.settings import DurabilitySettings
    from fairlane.store.api import Store

__all__ = ["Acknowledgement", "NotAcknowledged", "submit_acknowledged"]


class Acknowledgement(msgspec.Struct, frozen=True):
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


class NotAcknowledged(FairlaneError):
    """The jobs are stored on the primary, but the replicas or AOF fsyncs that the
    ``durability`` setting asks for did not confirm them in time: a failover or a
    crash may still lose them. ``jobs`` are their handles (a retry with the same
    idempotency key finds them, not new copies)."""

    # the type name jobs record and users match on (codec.encode_error): as before the move
    __module__ = "fairlane.admission"

    def __init__(self, jobs: list[Any], acknowledgement: Acknowledgement) -> None:
        super().__init__(f"the enqueue was not acknowledged: {acknowledgement.describe()}")
        self.jobs = jobs
        self.acknowledgement = acknowledgement


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


def _slot_moved(reply: ResponseError) -> bool:
    """Whether a cluster node refused the script because it no longer serves the slot."""
    if isinstance(reply, AskError | ClusterDownError | TryAgainError):  # MovedError is an AskError
        return True
    return str(reply).startswith(("MOVED ", "ASK ", "CLUSTERDOWN ", "TRYAGAIN "))


async def submit_acknowledged(
    store: Store, lane: str, jobs: Sequence[NewJob], durability: DurabilitySettings
) -> tuple[list[Submitted], Acknowledgement]:
    """``store.submit``, then wait (bounded by ``durability.timeout``) for the write to
    reach what ``durability`` asks; ``StoreUnavailable`` as for any call, and on a
    cluster whose node refused the script because the app's slot is moving;
    ``StoreFull`` above the memory mark, or from a server at its limit."""
    reckoned = await store.memory.admit(store.read_memory, jobs)
    try:
        sent = await store.prepare(jobs)  # large arguments go to the payload store first
        return await _send_acknowledged(store, store.enqueue_call(lane, sent), durability)
    finally:
        store.memory.settled(reckoned)


async def _send_acknowledged(
    store: Store, call: tuple[Any, ...], durability: DurabilitySettings
) -> tuple[list[Submitted], Acknowledgement]:
    wait = _wait_command(durability)
    cluster = is_cluster(store.blocking)

    async def send() -> list[Any]:
        # WAIT counts only its own connection's writes: a cluster's must go to the slot's
        # primary directly (a single server or Sentinel keeps ``store.blocking`` itself)
        async with slot_client(store.blocking, store.keys.stats) as client:
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("FCALL", *call)
            pipe.execute_command(*wait)
            return list(await pipe.execute(raise_on_error=False))

    for attempt in range(2):
        enqueued, waited = await store.blocking_call(durability.timeout, send)
        if isinstance(enqueued, ResponseError):
            if cluster and _slot_moved(enqueued):
                raise StoreUnavailable(
                    "the app's slot is moving between Redis cluster nodes; nothing was "
                    f"stored by this enqueue ({type(enqueued).__name__}: {enqueued})"
                ) from enqueued
            # a server restarted without its data has lost the library too: nothing
            # was enqueued, so load it and send the whole call again, once
            if attempt == 0 and "Function not found" in str(enqueued):
                await store.load_library()
                continue
            if out_of_memory(enqueued):
                raise server_full(enqueued) from enqueued
            raise enqueued
        return parse_submitted(enqueued), _acknowledgement(waited, durability)
    raise AssertionError("unreachable")  # pragma: no cover
