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

A timer costs about as much as a small function: each dump first times wrapped calls of
nothing against bare ones, and every figure is given less what its own timer and its
timed callees' timers cost. The figures say where the time goes and what a change moved,
not what an unwrapped library costs (``benchmarks.instructions`` counts that). Functions
a module keeps local are counted in their caller's ``self``.

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
#: wrapped calls of nothing a dump makes to tell what a timer costs
CALIBRATION_CALLS = 20_000

# The timers. Nothing runs at load but making closures: a library's load sees neither
# `os` nor `type`, and some of its functions run while it loads (memoised tables), so a
# wrapper times nothing until the first dump has switched the timers on. Each function's
# totals: calls, seconds with its callees, seconds without, timed callees called
# directly, timed callees in all.
_PRELUDE = r"""
local __prof = {totals = {}, child = {}, kids = {}, below = {}, depth = 0, live = false}
local function __prof_pack(...)
  return {n = select('#', ...), ...}
end
local function __prof_wrap(fn, name, totals)
  local e = {0, 0, 0, 0, 0}
  ;(totals or __prof.totals)[name] = e
  return function(...)
    local pr = __prof
    if not pr.live then
      return fn(...)
    end
    local depth = pr.depth + 1
    pr.depth, pr.child[depth], pr.kids[depth], pr.below[depth] = depth, 0, 0, 0
    local t0 = os.clock()
    local r = __prof_pack(fn(...))
    local dt = os.clock() - t0
    pr.depth = depth - 1
    if depth > 1 then
      pr.child[depth - 1] = pr.child[depth - 1] + dt
      pr.kids[depth - 1] = pr.kids[depth - 1] + 1
      pr.below[depth - 1] = pr.below[depth - 1] + 1 + pr.below[depth]
    end
    e[1], e[2], e[3] = e[1] + 1, e[2] + dt, e[3] + dt - pr.child[depth]
    e[4], e[5] = e[4] + pr.kids[depth], e[5] + pr.below[depth]
    return unpack(r, 1, r.n)
  end
end
"""

# What a timer costs: a wrapped call that does nothing, against the bare call, in a
# caller's time (`outer`) and in its own (`inner`). The first line of every dump.
_DUMP = rf"""
redis.register_function{{function_name = '{DUMP_FUNCTION}', callback = function()
  local out = {{}}
  for name, e in pairs(__prof.totals) do
    if e[1] > 0 then
      out[#out + 1] = string.format('%s %d %.9f %.9f %d %d', name, e[1], e[2], e[3], e[4], e[5])
    end
    e[1], e[2], e[3], e[4], e[5] = 0, 0, 0, 0, 0
  end
  __prof.depth, __prof.live = 0, true
  local bare = function() end
  local cal = {{}}
  local timed = __prof_wrap(bare, 'timer', cal)
  local n = {CALIBRATION_CALLS}
  local t0 = os.clock()
  for _ = 1, n do
    bare()
  end
  local t1 = os.clock()
  for _ = 1, n do
    timed()
  end
  local t2 = os.clock()
  __prof.depth = 0
  table.insert(out, 1, string.format('timer %.12f %.12f', ((t2 - t1) - (t1 - t0)) / n,
    cal.timer[2] / n))
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
    """One function's totals over a phase, in seconds, less what its timer and its
    timed callees' timers cost (so they may dip below nought for a function of a few
    steps)."""

    name: str
    calls: int
    inclusive: float
    own: float


async def read_profile(client: aioredis.Redis) -> list[Row]:
    """The totals since the last read (the first read switches the timers on)."""
    raw = [line.decode().split() for line in await client.fcall(DUMP_FUNCTION, 0)]  # type: ignore[misc]
    outer, inner = float(raw[0][1]), float(raw[0][2])
    rows = []
    for name, n, incl, own, kids, below in raw[1:]:
        calls = int(n)
        rows.append(
            Row(
                name,
                calls,
                float(incl) - calls * inner - int(below) * outer,
                float(own) - calls * inner - int(kids) * (outer - inner),
            )
        )
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
        # the enqueue's read just set the totals to nought
        phases["fetch"], phases["settle"] = await split_drain(
            app, jobs, lambda: None, lambda: read_profile(client)
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
