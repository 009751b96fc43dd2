"""``fairlane bench``: the benchmark suite (``benchmarks/`` in a source checkout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fairlane.bench import run_bench

__all__ = ["bench"]

_PEERS = ("arq", "saq", "streaq", "taskiq")
_PHASES = ("throughput", "latency", "noisy", "tenants", "submit", "overload")


def bench(
    *,
    redis_url: Annotated[
        str | None, typer.Option(help="Server to measure on (default: Redis on 127.0.0.1:6379).")
    ] = None,
    peers: Annotated[
        bool, typer.Option(help="Also measure the peers (arq, SAQ, streaq, taskiq-redis).")
    ] = True,
    peer: Annotated[
        list[str] | None,
        typer.Option(help=f"Measure only this peer (repeatable): {', '.join(_PEERS)}."),
    ] = None,
    reps: Annotated[int | None, typer.Option(help="Repetitions (default 3).")] = None,
    quick: Annotated[bool, typer.Option(help="Small sizes and one repetition.")] = False,
    phase: Annotated[
        list[str] | None,
        typer.Option(help=f"Run only this scenario (repeatable): {', '.join(_PHASES)}."),
    ] = None,
    jobs: Annotated[int | None, typer.Option(help="Throughput jobs (default 20,000).")] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Worker concurrency (default 100).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the interleaving.")] = None,
    peers_dir: Annotated[
        str | None, typer.Option(help="Where the peers' environments live.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="JSON file or directory; the .md table goes beside it.")
    ] = None,
) -> None:
    """Measure Fairlane and its peers on one server, interleaved; print medians and ratios."""
    for name in peer or ():
        if name not in _PEERS:
            typer.echo(f"error: unknown peer {name!r}; choose from {', '.join(_PEERS)}", err=True)
            raise typer.Exit(2)
    for name in phase or ():
        if name not in _PHASES:
            typer.echo(f"error: unknown phase {name!r}; choose from {', '.join(_PHASES)}", err=True)
            raise typer.Exit(2)
    try:
        run_bench(
            redis_url,
            peers=peer if peers and peer else peers,
            reps=reps,
            quick=quick,
            phases=phase,
            out=out,
            jobs=jobs,
            concurrency=concurrency,
            seed=seed,
            peers_dir=peers_dir,
        )
    except (RuntimeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
