"""The ceiling ``benchmarks.gateway`` holds the gateway against: a bare ASGI app.

``POST /v1/jobs`` on Starlette, served by uvicorn with the settings ``fairlane gateway``
uses (``uvicorn.run(app, host, port, log_level, access_log=False)``, the same event
loop and HTTP parser choice): it reads the body, parses it as JSON, makes one Redis
call (a ``SET`` of the body under a fresh id, on a keep-alive connection pool of
redis-py with hiredis, as Fairlane's own client) and answers 202 with a body shaped
like the gateway's. No authentication, no validation, no admission: what the server
stack itself costs per request, and so the most the gateway could serve on it.

Run: ``python -m benchmarks.bare_asgi --port 8090 --redis-url URL [--workers 2]``
(its keys are ``bare:<prefix>:<id>``: ``--prefix`` names them, to purge).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets

import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["build", "from_environment"]

URL_ENV = "FAIRLANE_BARE_REDIS_URL"
PREFIX_ENV = "FAIRLANE_BARE_PREFIX"


def build(redis_url: str, prefix: str) -> Starlette:
    """The bare app: one route, one Redis call per request."""
    client = aioredis.Redis.from_url(redis_url)

    async def submit(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("task"), str):
            return JSONResponse({"detail": "not a job"}, status_code=422)
        job_id = secrets.token_hex(13)
        await client.set(f"bare:{prefix}:{job_id}", json.dumps(body))
        return JSONResponse(
            {
                "id": job_id,
                "state": "accepted",
                "created": True,
                "status_url": f"/v1/jobs/{job_id}",
            },
            status_code=202,
        )

    return Starlette(routes=[Route("/v1/jobs", submit, methods=["POST"])])


def from_environment() -> Starlette:
    """The app of one worker process of ``--workers`` (uvicorn imports it by name)."""
    return build(os.environ[URL_ENV], os.environ[PREFIX_ENV])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", default="bench")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    common = {"host": args.host, "port": args.port, "log_level": args.log_level}
    if args.workers > 1:
        os.environ[URL_ENV], os.environ[PREFIX_ENV] = args.redis_url, args.prefix
        uvicorn.run(
            "benchmarks.bare_asgi:from_environment",
            factory=True,
            workers=args.workers,
            access_log=False,
            **common,
        )
    else:
        uvicorn.run(build(args.redis_url, args.prefix), access_log=False, **common)


if __name__ == "__main__":
    main()
