"""A TCP proxy between Fairlane and its server that a test can break on purpose.

:class:`FaultProxy` listens on a free port of 127.0.0.1 and relays every connection
to the upstream server, in the test's own event loop. The test controls the link:

- :meth:`FaultProxy.pause` blackholes it: bytes stop flowing both ways but every
  connection stays open, as when a network path silently drops packets;
  :meth:`FaultProxy.resume` delivers what was held and carries on (TCP would have
  retransmitted it). Connections opened meanwhile are accepted and held too.
- :meth:`FaultProxy.reset` aborts every open connection with a TCP RST, both sides;
  new connections work at once.
- :meth:`FaultProxy.slow` delays every chunk relayed by that many seconds.

Each connection is two relay tasks in one task group; closing the proxy aborts
them all, so nothing outlives the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

__all__ = ["FaultProxy"]

_CHUNK = 65536


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """Relays 127.0.0.1:<port> to ``upstream``; use ``async with``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._delay = 0.0
        self.connections = 0  # accepted since the start, for the tests' own checks
        self.resets = 0

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
        self._flowing.set()
        tasks = [link.task for link in self._links if link.task is not None]
        for link in list(self._links):
            link.abort()  # ends both relays of the link, and so its handler
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=5)
            for task in late:
                task.cancel()
        if self._server is not None:
            async with asyncio.timeout(5):
                await self._server.wait_closed()

    # -- faults -----------------------------------------------------------------------

    def pause(self) -> None:
        """Stop relaying (both ways, every connection) until :meth:`resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def reset(self) -> int:
        """Abort every open connection (RST to both sides); returns how many."""
        links = list(self._links)
        for link in links:
            link.abort()
        self.resets += len(links)
        return len(links)

    def slow(self, delay: float) -> None:
        """Hold every relayed chunk ``delay`` seconds (0: back to full speed)."""
        self._delay = delay

    # -- relaying ---------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        link.task = asyncio.current_task()
        self._links.add(link)
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            link.upstream = up_writer
            async with asyncio.TaskGroup() as group:
                group.create_task(self._relay(reader, up_writer))
                group.create_task(self._relay(up_reader, writer))
        except* (OSError, asyncio.IncompleteReadError):
            pass  # a reset or a closed side ends the link; that is the point
        finally:
            self._links.discard(link)
            link.abort()

    async def _relay(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            chunk = await source.read(_CHUNK)
            # held here while paused: what was read is delivered on resume, in order
            await self._flowing.wait()
            if self._delay:
                await asyncio.sleep(self._delay)
            if not chunk:
                with contextlib.suppress(OSError, RuntimeError):
                    if not sink.is_closing() and sink.can_write_eof():
                        sink.write_eof()
                return
            sink.write(chunk)
            await sink.drain()
