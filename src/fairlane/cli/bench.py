"""``fairlane bench``: the benchmark suite (``benchmarks/`` in a source checkout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fairlane.bench import run_bench

__all__ = ["bench"]


def bench(
    *,
    redis_url: Annotated[
        str | None, typer.Option(help="Server to measure on (default: Redis on 127.0.0.1:6379).")
    ] = None,
    jobs: Annotated[int, typer.Option(help="Jobs per throughput and enqueue run.")] = 20_000,
    concurrency: Annotated[int, typer.Option(help="Worker concurrency.")] = 100,
    peers: Annotated[bool, typer.Option(help="Also measure taskiq-redis in the same run.")] = True,
    phase: Annotated[
        list[str] | None,
        typer.Option(
            help="Run only this phase (repeatable): throughput, latency, enqueue, idle, recovery."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="JSON file or directory for the figures.")
    ] = None,
) -> None:
    """Measure Fairlane (and taskiq-redis) on one server; print ratios, write JSON."""
    try:
        run_bench(redis_url, jobs, concurrency, peers, out, phases=phase)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
