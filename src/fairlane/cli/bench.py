"""``fairlane bench``: run the benchmark suite of a source checkout and show its figures.

The suite itself lives in the repository's ``benchmarks/`` package (it is not part of
the installed library); this module finds it next to ``src/``, runs it, writes the
figures as JSON and markdown and prints them as Rich tables. Each peer (arq, SAQ,
streaq, taskiq-redis) runs in a virtual environment of its own that the suite makes
on first use. ``benchmarks/README.md`` explains every figure.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["DEFAULT_URL", "bench", "render", "run_bench"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_ARROWS = {"higher": "\u2191", "lower": "\u2193"}  # which way is better
_CHECKOUT = Path(__file__).resolve().parents[3]
_SUITE = _CHECKOUT / "benchmarks"


def _load(module: str) -> ModuleType:
    """Import ``benchmarks.<module>`` from this checkout (not any other ``benchmarks``)."""
    if not (_SUITE / "core.py").is_file():
        raise RuntimeError(
            "fairlane bench runs the suite of a source checkout; no benchmarks/ package "
            f"next to {_CHECKOUT / 'src'}"
        )
    if str(_CHECKOUT) not in sys.path:
        sys.path.insert(0, str(_CHECKOUT))
    loaded = importlib.import_module(f"benchmarks.{module}")
    origin = Path(loaded.__file__ or "").resolve()
    if origin.parent != _SUITE:
        raise RuntimeError(f"another 'benchmarks' package shadows the suite: {origin}")
    return loaded


def run_bench(
    redis_url: str | None = None,
    *,
    peers: bool | Sequence[str] = True,
    reps: int | None = None,
    quick: bool = False,
    phases: Sequence[str] | None = None,
    out: Path | None = None,
    console: Console | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run the suite against ``redis_url`` (default: the local Redis on 6379) and print it.

    ``peers``: all of them (True), none (False) or those named (``arq``, ``saq``,
    ``streaq``, ``taskiq``). ``phases``: the scenarios to run (default all). ``quick``:
    small sizes and one repetition. ``out`` is the JSON file to write, or a directory for
    ``<timestamp>.json``; by default ``benchmarks/results/``; the markdown table goes
    beside it (``.md``). ``options`` go to ``benchmarks.config.Config`` (e.g. ``jobs``,
    ``concurrency``, ``latency_samples``, ``seed``, ``peers_dir``, ``fairlane_env``).
    Returns the figures.
    """
    config, core, venvs = _load("config"), _load("core"), _load("venvs")
    if peers is True:
        chosen: tuple[str, ...] = tuple(venvs.PEERS)
    elif peers is False:
        chosen = ()
    else:
        chosen = tuple(dict.fromkeys(peers))
    cfg = config.Config.make(
        redis_url or DEFAULT_URL,
        quick=quick,
        reps=reps,
        peers=chosen,
        scenarios=tuple(phases) if phases else None,
        **options,
    )
    console = console or Console()
    with console.status("benchmarking...") as status:

        def progress(step: str) -> None:
            status.update(f"benchmarking: {step}")
            console.log(step)

        result: dict[str, Any] = asyncio.run(core.run_suite(cfg, progress))
    path = _output_path(out)
    result["meta"]["output"] = str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    path.with_suffix(".md").write_text(result["markdown"])
    render(result, console)
    console.print(f"figures written to {path} and {path.with_suffix('.md').name}")
    return result


def _output_path(out: Path | None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if out is None:
        return _SUITE / "results" / f"{stamp}.json"
    if out.suffix == ".json":
        return out
    return out / f"{stamp}.json"


def _ratio(ratio: float | None, better: str) -> str:
    if ratio is None:
        return "-"
    good = (ratio > 1) if better == "higher" else (ratio < 1) if better == "lower" else None
    style = "" if good is None or abs(ratio - 1) < 0.05 else ("green" if good else "red")
    text = f"{ratio:.3g}x"
    return f"[{style}]{text}[/]" if style else text


def render(result: dict[str, Any], console: Console | None = None) -> None:
    """Print the summary as Rich tables: all systems, then Fairlane alone."""
    console = console or Console()
    _fmt = _load("core").fmt  # the suite's own number format, shared with its markdown
    meta = result["meta"]
    server = meta.get("server", {})
    cfg = meta["config"]
    labels = {"fairlane": "Fairlane", "arq": "arq", "saq": "SAQ", "streaq": "streaq"}
    labels["taskiq"] = "taskiq-redis"
    peers: list[str] = list(cfg["peers"])
    title = (
        f"Fairlane {meta['versions'].get('fairlane', {}).get('fairlane')}"
        + (f" vs {', '.join(labels.get(p, p) for p in peers)}" if peers else "")
        + f" -- medians of {cfg['reps']} rep(s), server {server.get('redis_version', '?')}, "
        f"{meta.get('cpus')} CPUs"
    )
    rows = result["summary"]
    table = Table(title=title, title_justify="left")
    table.add_column("Figure")
    table.add_column("", justify="center")
    table.add_column("Fairlane", justify="right")
    for peer in peers:
        table.add_column(f"{labels.get(peer, peer)} (F/it)", justify="right")
    if peers:
        table.add_column("F/best peer", justify="right")
    for row in (r for r in rows if r["shared"]):
        better = row["better"]
        cells = [f"{row['metric']} [dim]{row['unit']}[/]", _ARROWS.get(better, "")]
        cells.append(_fmt(row["values"].get("fairlane")))
        for peer in peers:
            value = row["values"].get(peer)
            ratio = _ratio(row["ratios"].get(peer), better)
            cells.append(f"{_fmt(value)} ({ratio})" if value is not None else "-")
        if peers:
            best = row.get("best_peer")
            name = labels.get(best, best) if best else "-"
            cells.append(f"{_ratio(row.get('vs_best'), better)} [dim]{name}[/]")
        table.add_row(*cells)
    if peers:
        table.caption = "(F/it): Fairlane's median / the peer's; arrows: which way is better"
    console.print(table)
    own = [r for r in rows if not r["shared"]]
    if own:
        alone = Table(title="Fairlane alone", title_justify="left")
        for name, justify in (("Figure", "left"), ("Unit", "left"), ("", "center")):
            alone.add_column(name, justify=justify)  # type: ignore[arg-type]
        alone.add_column("Median", justify="right")
        alone.add_column("Min - max", justify="right")
        for row in own:
            low_high = row["spread"].get("fairlane")
            span = f"{_fmt(low_high[0])} - {_fmt(low_high[1])}" if low_high else "-"
            alone.add_row(
                row["metric"],
                row["unit"],
                _ARROWS.get(row["better"], ""),
                _fmt(row["values"].get("fairlane")),
                span,
            )
        console.print(alone)
    _render_profile(result, console, _fmt)
    for warning in result.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")


def _render_profile(result: dict[str, Any], console: Console, fmt: Any) -> None:
    """The server time of each Lua library function (the ``profile`` scenario's medians),
    under the plain throughput run's jobs/s and FCALL us/job."""
    profile = _load("serverprofile")
    medians = result["medians"].get("fairlane", {})
    headline = profile.headline(medians, fmt)
    if headline is None:
        return
    table = Table(title="Server time per entry point", title_justify="left", caption=headline)
    for i, name in enumerate(profile.HEADER):
        numeric = 0 < i < len(profile.HEADER) - 1
        table.add_column(
            name, justify="right" if numeric else "left", no_wrap=i < len(profile.HEADER) - 1
        )
    rows = profile.table_rows(medians["profile"], fmt)
    for i, row in enumerate(rows):
        table.add_row(*row, end_section=i == len(rows) - 3)
    console.print(table)


# -- the command --------------------------------------------------------------

_PEERS = ("arq", "saq", "streaq", "taskiq")
_PHASES = (
    "throughput", "latency", "noisy", "memory", "startup", "limit", "profile", "tenants",
    "submit", "keyed", "overload", "shared_key", "upstream", "backlog",
)  # fmt: skip


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
    fairlane_env: Annotated[
        str | None,
        typer.Option(
            help="Where Fairlane runs: 'own' (an environment of its own, as each peer's; "
            "the default) or 'suite' (this interpreter)."
        ),
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
            fairlane_env=fairlane_env,
        )
    except (RuntimeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
