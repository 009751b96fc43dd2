"""``fairlane bench``: run the benchmark suite of a source checkout and show its figures.

The suite itself lives in the repository's ``benchmarks/`` package (it is not part of
the installed library, and it needs the ``bench`` extra for the taskiq-redis peer);
this module finds it next to ``src/``, runs it, writes the figures as JSON and prints
them as Rich tables. ``benchmarks/README.md`` explains every figure.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["DEFAULT_URL", "render", "run_bench"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_ARROWS = {"higher": "\u2191", "lower": "\u2193"}  # which way is better
_CHECKOUT = Path(__file__).resolve().parents[2]
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
    redis_url: str | None,
    jobs: int,
    concurrency: int,
    peers: bool,
    out: Path | None,
    *,
    phases: Sequence[str] | None = None,
    console: Console | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run the suite against ``redis_url`` (default: the local Redis on 6379) and print it.

    ``out`` is the JSON file to write, or a directory for ``<timestamp>.json``; by
    default ``benchmarks/results/``. ``options`` go to ``benchmarks.config.Config``
    (e.g. ``latency_samples``, ``idle_seconds``). Returns the figures written.
    """
    if peers and importlib.util.find_spec("taskiq_redis") is None:
        raise RuntimeError("the taskiq-redis peer is not installed: pip install 'fairlane[bench]'")
    config, core = _load("config"), _load("core")
    cfg = config.Config(
        url=redis_url or DEFAULT_URL,
        jobs=jobs,
        concurrency=concurrency,
        peers=peers,
        phases=tuple(phases or config.PHASES),
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
    render(result, console)
    console.print(f"figures written to {path}")
    return result


def _output_path(out: Path | None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if out is None:
        return _SUITE / "results" / f"{stamp}.json"
    if out.suffix == ".json":
        return out
    return out / f"{stamp}.json"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if size >= 0.1 or size == 0 else f"{value:.3f}"


def _ratio(row: dict[str, Any]) -> str:
    ratio: float | None = row.get("ratio")
    if ratio is None:
        return "-"
    better = row["better"]
    good = (ratio > 1) if better == "higher" else (ratio < 1) if better == "lower" else None
    style = "" if good is None or abs(ratio - 1) < 0.05 else ("green" if good else "red")
    text = f"{ratio:.2f}x"
    return f"[{style}]{text}[/]" if style else text


def render(result: dict[str, Any], console: Console | None = None) -> None:
    """Print the summary (and where the commands go) as Rich tables."""
    console = console or Console()
    peers = "taskiq" in result
    meta = result["meta"]
    server = meta.get("server", {})
    cfg = meta["config"]
    title = (
        f"Fairlane {meta['versions'].get('fairlane')}"
        + (f" vs taskiq-redis {meta['versions'].get('taskiq-redis')}" if peers else "")
        + f" -- {cfg['jobs']:,} jobs, concurrency {cfg['concurrency']}, "
        f"server {server.get('redis_version', '?')}, {meta.get('cpus')} CPUs"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("Figure")
    table.add_column("Unit")
    table.add_column("Fairlane", justify="right")
    if peers:
        table.add_column("taskiq-redis", justify="right")
        table.add_column("F/peer", justify="right")
        table.add_column("", justify="center")
    for row in result["summary"]:
        cells = [row["metric"], row["unit"], _fmt(row["fairlane"])]
        if peers:
            cells += [_fmt(row["taskiq"]), _ratio(row), _ARROWS.get(row["better"], "")]
        table.add_row(*cells)
    table.caption = _recovery_caption(result)
    console.print(table)
    _render_commands(result, console)
    for warning in result.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")


def _recovery_caption(result: dict[str, Any]) -> str | None:
    rec = result["fairlane"].get("recovery")
    if not rec:
        return None
    parts = [
        f"Recovery: Fairlane lease {rec['lease_seconds']:g}s",
        f"renew {rec['renew_interval']:g}s",
        f"sweep {rec['sweep_interval']:g}s",
        f"task {rec['task_seconds']:g}s",
    ]
    peer = result.get("taskiq", {}).get("recovery")
    if peer:
        parts.append(f"taskiq idle_timeout {peer['idle_timeout_seconds']:g}s")
    return ", ".join(parts)


def _render_commands(result: dict[str, Any], console: Console) -> None:
    systems = [s for s in ("fairlane", "taskiq") if "throughput" in result.get(s, {})]
    if not systems:
        return
    per_job: dict[str, dict[str, float]] = {}
    for system in systems:
        total = result[system]["throughput"]["calls"]["total"]
        jobs = total["jobs"]
        per_job[system] = {k: v / jobs for k, v in total["server_by_command"].items()}
    names = sorted(
        {n for counts in per_job.values() for n in counts},
        key=lambda n: -max(c.get(n, 0.0) for c in per_job.values()),
    )
    table = Table(
        title="Server commands per job, by command (throughput phase)", title_justify="left"
    )
    table.add_column("Command")
    for system in systems:
        table.add_column("Fairlane" if system == "fairlane" else "taskiq-redis", justify="right")
    for name in names[:12]:
        table.add_row(name, *(_fmt(per_job[s].get(name)) for s in systems))
    console.print(table)
