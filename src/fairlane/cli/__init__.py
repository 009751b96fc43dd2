"""The ``fairlane`` command line.

``fairlane worker MODULE:APP`` runs a worker; ``purge``, ``drain``, ``inspect``, ``dead``
and ``job`` operate an app; ``doctor``, ``config`` and ``server`` look after the environment;
``example`` runs the quickstart, ``demo`` shows a noisy neighbor tamed (fair against
FIFO), ``simulate`` runs policies on a virtual clock, ``runs`` inspects workflow runs,
``explain`` says where a job's time went;
``bench`` measures; ``gateway`` serves the HTTP API and ``tenants`` manages its keys and
pauses or quarantines a tenant; ``pause``, ``resume`` and ``pauses`` hold a task's, a
lane's or a fairness key's dispatch.
Each command lives in a submodule of this package.
"""

from __future__ import annotations

import typer

from fairlane.cli.bench import bench
from fairlane.cli.demo import demo
from fairlane.cli.drain import drain
from fairlane.cli.example import example
from fairlane.cli.explain import explain
from fairlane.cli.gateway import gateway
from fairlane.cli.load import inspect_load
from fairlane.cli.ops import dead_app, inspect_app, job_app, purge
from fairlane.cli.pausing import (
    pause,
    pauses,
    resume,
    tenants_pause,
    tenants_quarantine,
    tenants_resume,
)
from fairlane.cli.runs import runs_app
from fairlane.cli.simulate import simulate
from fairlane.cli.system import config_app, doctor, server_app
from fairlane.cli.tenants_cli import tenants_app
from fairlane.cli.worker import worker

__all__ = ["cli", "main"]

cli = typer.Typer(
    name="fairlane",
    help="Fairlane: a fair, bounded, durable task queue on Redis or Valkey.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold server passwords
)
cli.command(no_args_is_help=True)(worker)
cli.command(no_args_is_help=True)(purge)
cli.command(no_args_is_help=True)(drain)
inspect_app.command("load")(inspect_load)
cli.add_typer(inspect_app, name="inspect")
cli.add_typer(dead_app, name="dead")
cli.add_typer(job_app, name="job")
cli.add_typer(runs_app, name="runs")
cli.command(no_args_is_help=True)(explain)
cli.command()(doctor)
cli.add_typer(config_app, name="config")
cli.add_typer(server_app, name="server")
cli.command()(demo)
cli.command()(simulate)
cli.command()(example)
cli.command()(bench)
cli.command(no_args_is_help=True)(gateway)
tenants_app.command("pause", no_args_is_help=True)(tenants_pause)
tenants_app.command("resume", no_args_is_help=True)(tenants_resume)
tenants_app.command("quarantine", no_args_is_help=True)(tenants_quarantine)
cli.add_typer(tenants_app, name="tenants")
cli.command(no_args_is_help=True)(pause)
cli.command(no_args_is_help=True)(resume)
cli.command(no_args_is_help=True)(pauses)


def main() -> None:
    """Entry point of the ``fairlane`` script."""
    cli()
