"""The yardstick: a deliberately minimal Redis queue, the machine's limit for one.

It has what a queue cannot do without and nothing else: no fencing, no classes, no
admission, no events, no retries. Jobs are their ids (``ID_WIDTH`` digits) followed by
msgpack records ``[task, a, b]``, pushed onto lists in bulk beforehand (not timed).
One Lua script dispatches: it pops up to K jobs (K, the worker's free slots) and
leases them in a sorted set (score now + 30 s, member the job's id). Another settles a
batch of finished jobs: each one's result under a key of its own with a 300 s TTL, then
one ``ZREM`` of the batch from the lease set. Two ways to dispatch:

* ``fifo``: one list, one ``LPOP key K``;
* ``fair``: one list per tenant and a sorted set of the tenants by virtual time; the
  script takes the tenant with the lowest virtual time, pops one of its jobs, adds 1 to
  its virtual time, or drops it from the set when its list is empty, and repeats until
  it has K jobs or no tenant is left: one pop per tenant visit, a crude stand-in for
  weighted fair queuing.

One worker (asyncio, redis-py's client, its hiredis parser and uvloop when installed)
drains the jobs at ``concurrency`` slots. One of its loops asks for as many jobs as
slots are free and starts them; another settles what has finished, so that settlements
and dispatches overlap at the server as in any queue's worker. The time runs from the
first dispatch to the last settlement; the figure is jobs/s. Fairlane's throughput over
this figure, measured on the same server in the same run, says how close to the machine Fairlane is.

The run's keys share the prefix ``{<ns>}:`` and are deleted afterwards.

Run: ``python -m benchmarks.yardstick [--redis-url URL] [--mode fifo|fair ...] [--jobs
20000] [--concurrency 100] [--tenants 10000] [--ns NAME]``: one JSON line of figures
per mode. The suite's ``limit`` phase runs it this way, one mode per process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.utils import HIREDIS_AVAILABLE

MODES = ("fifo", "fair")
LEASE_S = 30
RESULT_TTL_S = 300
DEFAULT_URL = "redis://127.0.0.1:6379/0"
_CHUNK = 1_000  # jobs per RPUSH, keys per SCAN and UNLINK
#: a job's id, the first bytes of its payload (zero-padded digits): the lease script
#: takes it with a substring, not by decoding the job
ID_WIDTH = 12

# Lua's unpack() is bounded by the C stack (8,000 slots in Redis), so a call's
# arguments go in slices; at the default concurrency one slice holds the whole batch
_UNPACK = """
local function in_slices(cmd, key, args)
  for i = 1, #args, 2000 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 1999, #args)))
  end
end
"""

_LEASE = """
local function lease(key, jobs)
  if #jobs == 0 then return jobs end
  local now = redis.call('TIME')
  local deadline = now[1] + now[2] / 1000000 + LEASE_S
  local args = {}
  for i, job in ipairs(jobs) do
    args[2 * i - 1] = deadline
    args[2 * i] = string.sub(job, 1, ID_WIDTH)
  end
  in_slices('ZADD', key, args)
  return jobs
end
""".replace("LEASE_S", str(LEASE_S)).replace("ID_WIDTH", str(ID_WIDTH))

#: KEYS: the list, the lease set; ARGV: K
FIFO_LUA = (
    _UNPACK
    + _LEASE
    + """
return lease(KEYS[2], redis.call('LPOP', KEYS[1], ARGV[1]) or {})
"""
)

#: KEYS: the tenants' virtual times, the lease set; ARGV: K, the tenant lists' prefix
FAIR_LUA = (
    _UNPACK
    + _LEASE
    + """
local vt, prefix, want = KEYS[1], ARGV[2], tonumber(ARGV[1])
local jobs = {}
while #jobs < want do
  local top = redis.call('ZPOPMIN', vt)
  if #top == 0 then break end
  local list = prefix .. top[1]
  local job = redis.call('LPOP', list)
  if job then jobs[#jobs + 1] = job end
  if redis.call('LLEN', list) > 0 then
    redis.call('ZADD', vt, top[2] + 1, top[1])
  end
end
return lease(KEYS[2], jobs)
"""
)

#: KEYS: the lease set; ARGV: the results' prefix, their TTL, then id, result pairs
ACK_LUA = (
    _UNPACK
    + """
local prefix, ttl = ARGV[1], ARGV[2]
local ids = {}
for i = 3, #ARGV, 2 do
  redis.call('SET', prefix .. ARGV[i], ARGV[i + 1], 'EX', ttl)
  ids[#ids + 1] = ARGV[i]
end
if #ids > 0 then in_slices('ZREM', KEYS[1], ids) end
return #ids
"""
)


class Record(msgspec.Struct, array_like=True):
    """A job as it is queued, after its id: ``[task, a, b]`` in msgpack."""

    task: str
    a: int
    b: int


def pack(job_id: int, task: str, a: int, b: int) -> bytes:
    """A job's payload: its id in ``ID_WIDTH`` digits, then its record."""
    return f"{job_id:0{ID_WIDTH}d}".encode() + msgspec.msgpack.encode(Record(task, a, b))


def job_id(payload: bytes) -> int:
    return int(payload[:ID_WIDTH])


async def noop(a: int, b: int) -> int:
    return a + b


TASKS: dict[str, Callable[[int, int], Awaitable[int]]] = {"noop": noop}


class Queue:
    """One run's keys and scripts on one connection pool."""

    def __init__(self, client: aioredis.Redis, ns: str, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.client, self.mode = client, mode
        self.prefix = f"{{{ns}}}:"
        self.fifo, self.vt = self.prefix + "q", self.prefix + "vt"
        self.tenant_prefix, self.results = self.prefix + "t:", self.prefix + "r:"
        self.lease = self.prefix + "lease"
        self.dispatch_script = client.register_script(FIFO_LUA if mode == "fifo" else FAIR_LUA)
        self.ack_script = client.register_script(ACK_LUA)

    async def load(self) -> None:
        """Load both scripts, so that the timed loop sends their SHAs alone."""
        for script in (self.dispatch_script, self.ack_script):
            await self.client.script_load(script.script)

    def dispatch_args(self, slots: int) -> tuple[Any, ...]:
        if self.mode == "fifo":
            return (self.dispatch_script.sha, 2, self.fifo, self.lease, slots)
        return (self.dispatch_script.sha, 2, self.vt, self.lease, slots, self.tenant_prefix)

    def ack_args(self, done: list[Any]) -> tuple[Any, ...]:
        return (self.ack_script.sha, 1, self.lease, self.results, RESULT_TTL_S, *done)

    async def enqueue(self, jobs: int, tenants: int = 1) -> int:
        """Queue ``jobs`` records (round robin over ``tenants`` in ``fair``); returns the
        tenants that got jobs."""
        payloads = [pack(i, "noop", i % 10, 1) for i in range(jobs)]
        pipe = self.client.pipeline(transaction=False)
        if self.mode == "fifo":
            active = 1
            for i in range(0, jobs, _CHUNK):
                pipe.rpush(self.fifo, *payloads[i : i + _CHUNK])
        else:
            active = max(1, min(tenants, jobs))
            for t in range(active):
                pipe.rpush(f"{self.tenant_prefix}t{t}", *payloads[t::active])
            pipe.zadd(self.vt, {f"t{t}": 0 for t in range(active)})
        await pipe.execute()
        return active

    async def drain(self, concurrency: int) -> tuple[int, float]:
        """Run every queued job at ``concurrency`` slots: (jobs run, seconds).

        Two loops share the worker, as in any queue's worker: one asks for as many jobs
        as slots are free and starts them, the other settles what has finished, so that
        a settlement and the next dispatch are at the server together."""
        decode = msgspec.msgpack.Decoder(Record).decode
        encode = msgspec.msgpack.encode
        client = self.client
        free = asyncio.Semaphore(concurrency)
        finished: list[Any] = []
        some_finished = asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        ran = 0
        dispatching = True

        async def run_one(payload: bytes) -> None:
            job = decode(payload[ID_WIDTH:])
            finished.extend((payload[:ID_WIDTH], encode(await TASKS[job.task](job.a, job.b))))
            free.release()
            some_finished.set()

        async def settle() -> None:
            while dispatching or running or finished:
                if not finished:
                    some_finished.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(some_finished.wait(), 0.05)
                    continue
                done = finished[:]
                finished.clear()
                await client.evalsha(*self.ack_args(done))

        started = time.perf_counter()
        settler = asyncio.create_task(settle())
        try:
            while True:
                await free.acquire()
                slots = 1
                while not free.locked():
                    await free.acquire()
                    slots += 1
                batch: list[bytes] = await client.evalsha(*self.dispatch_args(slots))
                for _ in range(slots - len(batch)):
                    free.release()
                if not batch:
                    break
                ran += len(batch)
                for payload in batch:
                    task = asyncio.create_task(run_one(payload))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            dispatching = False
            await settler
        return ran, time.perf_counter() - started

    async def leftovers(self) -> dict[str, int]:
        """What is left once the drain is over: queued jobs and leases (both 0 when every
        job ran and was settled)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(self.fifo)
        pipe.zcard(self.vt)
        pipe.zcard(self.lease)
        fifo, tenants, leased = await pipe.execute()
        return {"queued_fifo": fifo, "tenants_left": tenants, "leased": leased}

    async def clean(self) -> int:
        """Delete the run's keys; returns how many results were stored."""
        results: set[bytes] = set()  # SCAN may return a key twice
        batch: list[bytes] = []
        async for key in self.client.scan_iter(match=f"{self.prefix}*", count=_CHUNK):
            if key.startswith(self.results.encode()):
                results.add(key)
            batch.append(key)
            if len(batch) >= _CHUNK:
                await self.client.unlink(*batch)
                batch = []
        if batch:
            await self.client.unlink(*batch)
        return len(results)


async def _commandstats(client: aioredis.Redis) -> dict[str, tuple[int, int]]:
    raw = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in raw.items()}


def _server_view(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], jobs: int
) -> dict[str, float]:
    """Server commands and script microseconds per job over the drain (the commands the
    scripts run counted too), without the INFO that reads them."""
    delta = {
        name: (calls - before.get(name, (0, 0))[0], usec - before.get(name, (0, 0))[1])
        for name, (calls, usec) in after.items()
        if name != "info"
    }
    scripts = [delta[n] for n in ("evalsha", "eval") if n in delta]
    return {
        "commands_per_job": sum(calls for calls, _ in delta.values()) / jobs,
        "script_calls": sum(calls for calls, _ in scripts),
        "script_usec_per_job": sum(usec for _, usec in scripts) / jobs,
    }


async def run(
    url: str, ns: str, mode: str, *, jobs: int = 20_000, concurrency: int = 100,
    tenants: int = 10_000,
) -> dict[str, Any]:  # fmt: skip
    """Enqueue ``jobs`` no-op jobs one way (``fifo`` or ``fair`` over ``tenants``), drain
    them with one worker at ``concurrency`` slots, delete the keys; returns the figures."""
    client = aioredis.Redis.from_url(url, decode_responses=False)
    queue = Queue(client, ns, mode)
    try:
        await queue.clean()  # a fresh namespace has none; a reused one starts empty
        await queue.load()
        active = await queue.enqueue(jobs, tenants)
        before = await _commandstats(client)
        cpu = time.process_time()
        ran, seconds = await queue.drain(concurrency)
        cpu = time.process_time() - cpu
        server = _server_view(before, await _commandstats(client), jobs)
        left = await queue.leftovers()
    finally:
        try:
            stored = await queue.clean()
        finally:
            await client.aclose()
    if ran != jobs or stored != jobs or any(left.values()):
        raise RuntimeError(f"{mode}: {jobs} jobs, {ran} ran, {stored} results, left {left}")
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    return {
        "mode": mode,
        "jobs": jobs,
        "concurrency": concurrency,
        "tenants": active,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds,
        "worker_cpu_share": cpu / seconds,
        "results_stored": stored,
        "server": server,
        "parser": "hiredis" if HIREDIS_AVAILABLE else "python",
        "loop": loop,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.yardstick", description=__doc__)
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--mode", action="append", choices=MODES, help="default: both")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--tenants", type=int, default=10_000, help="of the fair mode")
    parser.add_argument("--ns", default=None, help="the keys' prefix, before _<mode>")
    args = parser.parse_args(argv)
    ns = args.ns or f"yardstick_{os.getpid()}"
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: PLC0415 - optional: the default loop where it is missing

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        for mode in args.mode or MODES:
            figures = runner.run(
                run(args.redis_url, f"{ns}_{mode}", mode, jobs=args.jobs,
                    concurrency=args.concurrency, tenants=args.tenants)
            )  # fmt: skip
            print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
