"""``Upstream``: a model provider's rate limits on loopback, for tests and benchmarks.

A small HTTP server (Starlette under uvicorn, from the ``gateway`` extra) on its own
free port on 127.0.0.1, in a thread of its own with its own event loop, that answers
the way a model provider does when its limits are met. ``POST /v1/complete`` with JSON
``{"tokens": n}`` is one model call of ``n`` tokens; the caller's tenant is the
``X-Tenant`` header or the body's ``"tenant"``. The server admits it iff both of its
token buckets hold enough, on its own monotonic clock:

* requests: capacity ``requests_per_second`` (N), refilled continuously at N per
  second, one per call;
* tokens (when ``tokens_per_minute`` T is given): capacity T, refilled continuously at
  T per minute, ``n`` per call. A call of more than T tokens can never fit: 400.

An admitted call takes from both buckets at once, then sleeps ``latency`` seconds (a
model's time) and answers 200 with ``{"tokens": n, "tenant": ...}``. A call that does
not fit takes nothing and answers 429 at once with a ``Retry-After`` header saying when
it would have fit: whole seconds rounded up, at least 1 (``retry_after="seconds"``, the
default), or an HTTP-date rounded up to the next whole second
(``retry_after="http-date"``). So in any window of ``w`` seconds the server serves at
most ``N + N * w`` calls (:meth:`UpstreamStats.most_in_window` counts what it did).

It counts calls, 429s and tokens served, per tenant, and records when each call was
admitted or refused (wall-clock seconds, ``time.time()``): :meth:`Upstream.stats`,
``GET /v1/stats`` for another process. :meth:`Upstream.reset` refills the buckets and
clears the counts, so that one server can serve several runs. Every wait is bounded.

Example::

    with Upstream(requests_per_second=20, latency=0.05) as upstream:
        httpx.post(upstream.complete_url, json={"tokens": 500, "tenant": "acme"})
        print(upstream.stats().throttled)
"""

from __future__ import annotations

import asyncio
import bisect
import math
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Literal, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fairlane.testing.process import HOST, Managed

__all__ = ["RetryAfterForm", "TenantCounts", "Upstream", "UpstreamStats"]

RetryAfterForm = Literal["seconds", "http-date"]
TENANT_HEADER = "x-tenant"


@dataclass(slots=True)
class _Bucket:
    """``level`` as of ``stamp`` (monotonic seconds), refilled at ``rate`` per second up
    to ``capacity``."""

    capacity: float
    rate: float
    level: float
    stamp: float

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait(self, cost: float) -> float:
        """Seconds until ``cost`` fits, as of the last refill (0: it fits now)."""
        return max(0.0, (cost - self.level) / self.rate)


@dataclass(frozen=True, slots=True)
class TenantCounts:
    """One tenant's calls as the upstream saw them."""

    calls: int = 0
    """Every call that reached the endpoint."""
    served: int = 0
    """Calls admitted (200)."""
    throttled: int = 0
    """Calls answered 429."""
    tokens: int = 0
    """Tokens of the admitted calls."""


@dataclass(frozen=True, slots=True)
class UpstreamStats:
    """A snapshot of the upstream's counts since it started or was last reset."""

    calls: int
    served: int
    throttled: int
    refused: int
    """Calls answered 400 (a bad body, or more tokens than the token bucket holds)."""
    tokens: int
    tenants: Mapping[str, TenantCounts]
    served_at: tuple[tuple[float, str], ...]
    """(wall-clock second it was admitted, tenant) of each admitted call, in order."""
    throttled_at: tuple[tuple[float, str], ...]
    """(wall-clock second it was refused, tenant) of each 429, in order."""

    def most_in_window(self, seconds: float) -> int:
        """The most calls admitted in any window of ``seconds`` (closed at both ends)."""
        times = [t for t, _ in self.served_at]
        most = 0
        for i, start in enumerate(times):
            most = max(most, bisect.bisect_right(times, start + seconds) - i)
        return most

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, as ``GET /v1/stats`` answers (without the per-call times)."""
        return {
            "calls": self.calls,
            "served": self.served,
            "throttled": self.throttled,
            "refused": self.refused,
            "tokens": self.tokens,
            "tenants": {
                name: {
                    "calls": c.calls,
                    "served": c.served,
                    "throttled": c.throttled,
                    "tokens": c.tokens,
                }
                for name, c in self.tenants.items()
            },
        }


@dataclass(slots=True)
class _Counts:
    refused: int = 0
    tenants: dict[str, TenantCounts] = field(default_factory=dict)
    served_at: list[tuple[float, str]] = field(default_factory=list)
    throttled_at: list[tuple[float, str]] = field(default_factory=list)

    def add(self, tenant: str, *, served: bool, tokens: int) -> None:
        c = self.tenants.get(tenant, TenantCounts())
        self.tenants[tenant] = TenantCounts(
            c.calls + 1,
            c.served + served,
            c.throttled + (not served),
            c.tokens + (tokens if served else 0),
        )
        (self.served_at if served else self.throttled_at).append((time.time(), tenant))


class Upstream(Managed):
    """A rate-limited model endpoint on loopback: N requests per second, T tokens per
    minute, 429 with ``Retry-After`` beyond them. Use as a context manager, or call
    :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        requests_per_second: float,
        *,
        tokens_per_minute: float | None = None,
        latency: float = 0.0,
        retry_after: RetryAfterForm = "seconds",
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ) -> None:
        for label, value in (("requests_per_second", requests_per_second),
                             ("tokens_per_minute", tokens_per_minute)):  # fmt: skip
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(latency) and latency >= 0):
            raise ValueError(f"latency must be a finite number >= 0, got {latency!r}")
        if retry_after not in ("seconds", "http-date"):
            raise ValueError(f"retry_after must be 'seconds' or 'http-date', got {retry_after!r}")
        self.requests_per_second = float(requests_per_second)
        self.tokens_per_minute = None if tokens_per_minute is None else float(tokens_per_minute)
        self.latency = float(latency)
        self.retry_after = retry_after
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._lock = threading.Lock()
        self._requests, self._tokens = self._fresh_buckets()
        self._counts = _Counts()
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("Upstream has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    @property
    def complete_url(self) -> str:
        """The model-call endpoint, ``POST`` ``{"tokens": n}``."""
        return f"{self.url}/v1/complete"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def most_served(self, seconds: float, tokens_per_call: int = 0) -> float:
        """The most calls of ``tokens_per_call`` the upstream can admit in a window of
        ``seconds``: both buckets full when it opens, refilled through it."""
        most = self.requests_per_second * (1.0 + seconds)
        if self.tokens_per_minute is not None and tokens_per_call > 0:
            tokens = self.tokens_per_minute * (1.0 + seconds / 60.0)
            most = min(most, tokens / tokens_per_call)
        return most

    # ------------------------------------------------------------------ counts

    def stats(self) -> UpstreamStats:
        with self._lock:
            c = self._counts
            tenants = dict(c.tenants)
            served_at, throttled_at = tuple(c.served_at), tuple(c.throttled_at)
            refused = c.refused
        return UpstreamStats(
            calls=sum(t.calls for t in tenants.values()) + refused,
            served=sum(t.served for t in tenants.values()),
            throttled=sum(t.throttled for t in tenants.values()),
            refused=refused,
            tokens=sum(t.tokens for t in tenants.values()),
            tenants=tenants,
            served_at=served_at,
            throttled_at=throttled_at,
        )

    def reset(self) -> None:
        """Refill both buckets and clear the counts (calls in flight still answer)."""
        with self._lock:
            self._requests, self._tokens = self._fresh_buckets()
            self._counts = _Counts()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Serve on a free port of 127.0.0.1 in a thread; wait (bounded) until it listens."""
        if self.running:
            raise RuntimeError("Upstream is already running")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, 0))  # bound here and handed over: no race for the port
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._asgi(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            backlog=4096,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=self._serve, args=(server, sock), name=f"upstream-{self._port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the upstream did not start within {self._start_timeout}s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving: calls in flight get a bounded while to finish, then are dropped."""
        server, thread = self._server, self._thread
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(self._stop_timeout)
            if thread.is_alive() and server is not None:
                server.force_exit = True
                thread.join(self._stop_timeout)
        self._server = self._thread = None
        self._port = None

    def __repr__(self) -> str:
        state = f"running on port {self._port}" if self.running else "stopped"
        return f"<Upstream {self.requests_per_second:g}/s {state}>"

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    def _fresh_buckets(self) -> tuple[_Bucket, _Bucket | None]:
        now = time.monotonic()
        n = self.requests_per_second
        requests = _Bucket(n, n, n, now)
        t = self.tokens_per_minute
        return requests, (None if t is None else _Bucket(t, t / 60.0, t, now))

    def _admit(self, tokens: int) -> float:
        """Take one request and ``tokens`` if both fit now (0.0); else the seconds until
        they would, taking nothing."""
        now = time.monotonic()
        self._requests.refill(now)
        wait = self._requests.wait(1.0)
        if self._tokens is not None:
            self._tokens.refill(now)
            wait = max(wait, self._tokens.wait(float(tokens)))
        if wait <= 0.0:
            self._requests.level -= 1.0
            if self._tokens is not None:
                self._tokens.level -= tokens
        return wait

    def _retry_after(self, wait: float) -> str:
        if self.retry_after == "http-date":
            return formatdate(math.ceil(time.time() + wait), usegmt=True)
        return str(max(1, math.ceil(wait)))

    def _asgi(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/complete", self._complete, methods=["POST"]),
                Route("/v1/stats", self._stats, methods=["GET"]),
            ]
        )

    async def _stats(self, _: Request) -> JSONResponse:
        return JSONResponse(self.stats().as_dict())

    async def _complete(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        tokens = body.get("tokens", 0) if isinstance(body, dict) else None
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            return self._refuse(f"the body must be JSON {{'tokens': n >= 0}}, got {body!r}")
        if self.tokens_per_minute is not None and tokens > self.tokens_per_minute:
            return self._refuse(f"{tokens} tokens exceed the {self.tokens_per_minute:g}/min limit")
        tenant = request.headers.get(TENANT_HEADER) or str(body.get("tenant") or "")
        with self._lock:
            wait = self._admit(tokens)
            self._counts.add(tenant, served=wait <= 0.0, tokens=tokens)
        if wait > 0.0:
            return JSONResponse(
                {"error": "rate_limited", "retry_after_s": wait},
                status_code=429,
                headers={"Retry-After": self._retry_after(wait)},
            )
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        return JSONResponse({"tokens": tokens, "tenant": tenant})

    def _refuse(self, message: str) -> JSONResponse:
        with self._lock:
            self._counts.refused += 1
        return JSONResponse({"error": "invalid_request", "message": message}, status_code=400)
