"""The ``fairlane`` command line, every command of it (``fairlane.cli``)."""

from __future__ import annotations

from fairlane.cli._typer import fairlane_typer
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

__all__ = ["cli"]

cli = fairlane_typer()
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
