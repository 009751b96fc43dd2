"""Where a worker's calls spend their time inside the Lua library, function by function.

``benchmarks.instructions`` counts a call's server instructions as a whole: callgrind
sees the Lua interpreter, not the library's functions, and in a drain most of the
server's time is that interpreter running the library. This loads the library with
every function a module exports (``function mod.f`` and ``mod.f = f``) wrapped in a
timer on the server's own clock (``os.clock``, CPU seconds: Valkey has it, Redis 7.0
does not), into a private server started for the run (the bundled Valkey unless
``--server`` names another), then drains jobs as ``benchmarks.instructions --split``
does -- every job fetched, nothing settled, then all settled -- and prints, for the
enqueue, the fetch and the settle, each function's calls per job, its time per job with
what it called (``incl``) and without (``self``).

A timer costs about half a microsecond a call, and a function's ``self`` holds its
callees' timers: the figures say where the time goes and what a change moved, not what
an unwrapped library costs (``benchmarks.instructions`` counts that). Functions a module
keeps local are counted in their caller's ``self``.

The store loads its library only when the server holds none of its name, and the
wrapped one carries the release's name, so the app runs it as it is.

Run: ``python -m benchmarks.luaprofile [--jobs 5000] [--keyed 100] [--top 25]``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from dataclasses import dataclass

import redis.asyncio as aioredis

from benchmarks.instructions import NOOP, batches, split_drain
from benchmarks.keyed import LIMITS, RATES
from fairlane import App
from fairlane.store.library import instrumented_code
from fairlane.testing.server import RedisServer

__all__ = ["DUMP_FUNCTION", "Row", "exported", "profile", "profiled_code", "read_profile"]

#: the registered function that returns the timers' totals and sets them to nought
DUMP_FUNCTION = "fairlane_profile_dump"

# The timers. Nothing runs at load but making closures: a library's load sees neither
# `os` nor `type`, and some of its functions run while it loads (memoised tables), so a
# wrapper times nothing until the first dump has switched the timers on.
_PRELUDE = r"""
local __prof = {totals = {}, child = {}, depth = 0, live = false}
local function __prof_pack(...)
  return {n = select('#', ...), ...}
end
local function __prof_wrap(fn, name)
  local e = {0, 0, 0}
  __prof.totals[name] = e
  return function(...)
    local pr = __prof
    if not pr.live then
      return fn(...)
    end
    local depth = pr.depth + 1
    pr.depth, pr.child[depth] = depth, 0
    local t0 = os.clock()
    local r = __prof_pack(fn(...))
    local dt = os.clock() - t0
    pr.depth = depth - 1
    if depth > 1 then
      pr.child[depth - 1] = pr.child[depth - 1] + dt
    end
    e[1], e[2], e[3] = e[1] + 1, e[2] + dt, e[3] + dt - pr.child[depth]
    return unpack(r, 1, r.n)
  end
end
"""

_DUMP = rf"""
redis.register_function{{function_name = '{DUMP_FUNCTION}', callback = function()
  local out = {{}}
  for name, e in pairs(__prof.totals) do
    if e[1] > 0 then
      out[#out + 1] = name .. ' ' .. e[1] .. ' ' .. string.format('%.6f %.6f', e[2], e[3])
    end
    e[1], e[2], e[3] = 0, 0, 0
  end
  __prof.depth, __prof.live = 0, true
  return out
end}}
"""

_MODULE = re.compile(r"^local (\w+) = \{", re.MULTILINE)
_LOCAL_FUNCTION = re.compile(r"^\s*local function (\w+)\(", re.MULTILINE)


def exported(text: str) -> tuple[str, list[str]] | None:
    """A module's table and the functions it exports, or None for a file without one."""
    found = _MODULE.search(text)
    if found is None:
        return None
    mod = found.group(1)
    names = set(re.findall(rf"^\s*function {mod}\.(\w+)\(", text, re.MULTILINE))
    local = set(_LOCAL_FUNCTION.findall(text))
    for name, value in re.findall(rf"^\s*{mod}\.(\w+) = (\w+)\s*$", text, re.MULTILINE):
        if value in local:
            names.add(name)
    return mod, sorted(names)


def profiled_code() -> str:
    """The library, every exported function timed, with the dump function registered."""
    first = True

    def module(_file: str, text: str) -> str:
        nonlocal first
        head, first = (_PRELUDE if first else ""), False
        found = exported(text)
        if found is None:
            return head + text
        mod, names = found
        wraps = "".join(f"\n{mod}.{n} = __prof_wrap({mod}.{n}, '{mod}.{n}')" for n in names)
        return head + text + wraps + "\n"

    return instrumented_code(module) + _DUMP


@dataclass(frozen=True)
class Row:
    """One function's totals over a phase, in seconds."""

    name: str
    calls: int
    inclusive: float
    own: float


async def read_profile(client: aioredis.Redis) -> list[Row]:
    """The totals since the last read (the first read switches the timers on)."""
    rows = []
    for raw in await client.fcall(DUMP_FUNCTION, 0):  # type: ignore[misc]
        name, calls, inclusive, own = raw.decode().split()
        rows.append(Row(name, int(calls), float(inclusive), float(own)))
    return rows


def _print(phase: str, rows: list[Row], jobs: int, top: int) -> None:
    total = sum(r.own for r in rows)
    print(f"{phase}: {total / jobs * 1e6:.1f} us a job in timed functions")
    print(f"  {'function':<36} {'calls/job':>9} {'incl us':>8} {'self us':>8}")
    for r in sorted(rows, key=lambda r: -r.own)[:top]:
        print(
            f"  {r.name:<36} {r.calls / jobs:>9.2f} {r.inclusive / jobs * 1e6:>8.2f}"
            f" {r.own / jobs * 1e6:>8.2f}"
        )


async def profile(url: str, jobs: int, keyed: int = 0) -> dict[str, list[Row]]:
    """Each phase's totals: ``enqueue``, ``fetch``, ``settle``."""
    phases: dict[str, list[Row]] = {}
    client = aioredis.Redis.from_url(url)
    await client.function_load(profiled_code(), replace=True)
    app = App("luaprofile", redis_url=url, charge="cost")

    @app.task(name=NOOP)
    async def noop(n: int) -> int:
        return n

    async with app:
        await read_profile(client)
        batch = max(1, min(1_000, -(-jobs // keyed))) if keyed else 1_000
        for n, (tenant, calls) in enumerate(batches(jobs, batch, 0)):
            if keyed:
                key = f"user-{n % keyed}"
                await noop.enqueue_many(
                    calls, tenant=tenant, limits=LIMITS, rates=RATES, fairness_key=key
                )
            else:
                await noop.enqueue_many(calls, tenant=tenant)
        phases["enqueue"] = await read_profile(client)
        phases["fetch"], phases["settle"] = await split_drain(
            app, jobs, lambda: read_profile(client)
        )
    await client.aclose()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument(
        "--keyed",
        type=int,
        default=0,
        metavar="N",
        help="every job names the keyed benchmark's throttle and rate key "
        "and one of N fairness keys (at most 1,000 jobs then: the "
        "throttle key's limit)",
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--server", default=None, help="a server binary with os.clock")
    args = parser.parse_args()
    with RedisServer(args.server) as server:
        phases = asyncio.run(profile(server.url, args.jobs, args.keyed))
    for phase, rows in phases.items():
        _print(phase, rows, args.jobs, args.top)


if __name__ == "__main__":
    main()
