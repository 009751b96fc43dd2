"""What the store's agreement tests share: a private app on the real server, an event
loop to drive ``Store`` calls from hypothesis's synchronous rules, a teardown that
deletes every key the run wrote, ``lua_parts``, which lifts named helpers out of a
file of the library so that a test can run them alone as a script, and ``lua_modules``,
which runs whole modules of it on a stand-in for ``core``."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

from hypothesis.stateful import RuleBasedStateMachine

from fairlane.store.api import Store
from fairlane.store.connection import create_sync_client
from fairlane.store.library import _LUA, fill_constants

T = TypeVar("T")


class StoreMachine(RuleBasedStateMachine):
    """A state machine talking to ``redis_url`` through a fresh app named ``<prefix>_<hex>``."""

    redis_url: ClassVar[str] = ""
    prefix: ClassVar[str] = "s"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.app = f"{self.prefix}_{secrets.token_hex(4)}"
        self.store = Store.from_url(self.redis_url, self.app, max_connections=4)
        self.keys = self.store.keys
        self.client = create_sync_client(self.redis_url)
        self.run(self.store.connect())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Delete the run's keys and close every connection."""
        drop_app(self.store, self.client, self.loop)

    def teardown(self) -> None:
        self.close()


def drop_app(store: Store, client: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Delete every key of ``store``'s app (read through the sync ``client``), then
    close both and ``loop``, which ``store`` runs on."""
    try:
        keys = list(client.scan_iter(match=store.keys.match_all(), count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
        loop.run_until_complete(store.aclose())
        loop.close()


def lua_parts(file: str, *names: str) -> str:
    """The module-level ``local`` constants and ``local function``s called ``names`` in
    ``lua/<file>`` (those of its module's block), in the order named, with the policy's
    constants written in: a test appends its driver and runs the helpers as one script."""
    source = _LUA.joinpath(file).read_text()
    parts = []
    for name in names:
        found = re.search(
            rf"^( *)local function {name}\(.*?^\1end$|^( *)local {name} = [^\n]*$",
            source,
            re.M | re.S,
        )
        if found is None:
            raise LookupError(f"lua/{file} has no module-level local {name!r}")
        indent = found.group(1) or found.group(2) or ""
        lines = found.group(0).splitlines()
        parts.append("\n".join(line.removeprefix(indent) for line in lines))
    return fill_constants("\n".join(parts)) + "\n"


#: ``core.chunked`` for a stand-in ``core`` (``lua/writeback.lua`` writes a view back
#: with it): one command per ``core.ARGS`` arguments
CORE_CHUNKED = (
    "core.ARGS = 4000\n"
    "function core.chunked(cmd, key, list)\n"
    "  for i = 1, #list, core.ARGS do\n"
    "    redis.call(cmd, key, unpack(list, i, math.min(#list, i + core.ARGS - 1)))\n"
    "  end\n"
    "end\n"
)


#: the throttle's modules, in the library's order, for a test that runs them alone
THROTTLE_MODULES = ("writeback.lua", "classes.lua", "rates.lua", "keyparts.lua", "throttle.lua")

#: how a test's driver (Lua that defines ``drive()``) runs: each command at once, or
#: through the views the worker's calls use (``lua/writeback.lua``), written back when the
#: call returns
# The job records, as a throttle driver stands them in (KEYS[4]), with their leases
# standing in for the policy's grant tokens: a grant is kept in its job's record while it
# runs, under a token drawn here ('#tok' counts them), and dropped when released, so a
# release or pushback under a stale or repeated token finds none (the store's acks are
# fenced by the lease's token so). `keep_grant` returns the token (0 for no grant),
# `held_grant` the grant under a token, `take_grant` it and drops it.
GRANT_RECORDS = """
local function keep_grant(id, grant)
  if not grant then
    return 0
  end
  local token = redis.call('HINCRBY', KEYS[4], '#tok', 1)
  redis.call('HSET', KEYS[4], id, grant, 'tok:' .. id, token)
  return token
end
local function held_grant(id, token)
  if redis.call('HGET', KEYS[4], 'tok:' .. id) ~= token then
    return nil
  end
  return redis.call('HGET', KEYS[4], id)
end
local function take_grant(id, token)
  local grant = held_grant(id, token)
  if grant then
    redis.call('HDEL', KEYS[4], id, 'tok:' .. id)
  end
  return grant
end
"""


def grant_records(records: dict[str, str]) -> tuple[dict[str, tuple[str, str]], int]:
    """``GRANT_RECORDS``' hash, read: each job's (token, grant), and the tokens drawn."""
    held = {
        job: (records[f"tok:{job}"], grant)
        for job, grant in records.items()
        if not job.startswith(("#", "tok:"))
    }
    return held, int(records.get("#tok", 0))


DRIVER_RUNS = {
    "direct": "return drive()\n",
    "behind": "return writeback.behind(function() return drive() end)(KEYS, ARGV)\n",
}


def lua_modules(core: str, *files: str, expose: tuple[str, ...] = ()) -> str:
    """The modules of ``lua/<files>``, in order, on ``core`` (Lua that declares a stand-in
    ``core`` table: the fixed keys' indexes and helpers the test needs, a clock of its
    own say), with the policy's constants written in, then ``expose``'s entry points as
    locals (``'throttle.thr_acquire'`` as ``thr_acquire``): a test appends its driver."""
    source = core + "".join(_LUA.joinpath(f).read_text() for f in files)
    for path in expose:
        source += f"local {path.rpartition('.')[2]} = {path}\n"
    return fill_constants(source)
