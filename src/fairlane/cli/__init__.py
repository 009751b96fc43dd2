"""The ``fairlane`` command line.

``fairlane worker MODULE:APP`` runs a worker; ``purge``, ``drain``, ``inspect``, ``dead``
and ``job`` operate an app; ``doctor``, ``config`` and ``server`` look after the environment;
``example`` runs the quickstart, ``demo`` shows a noisy neighbor tamed (fair against
FIFO), ``simulate`` runs policies on a virtual clock, ``runs`` inspects workflow runs,
``explain`` says where a job's time went;
``bench`` measures; ``gateway`` serves the HTTP API and ``tenants`` manages its keys and
pauses or quarantines a tenant; ``pause``, ``resume`` and ``pauses`` hold a task's, a
lane's or a fairness key's dispatch.
Each command lives in a submodule of this package; ``commands`` puts them together.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

    from fairlane.cli.commands import cli

__all__ = ["cli", "main"]


def __getattr__(name: str) -> object:
    # the whole command line is assembled when it is first named (``_command_line``)
    if name == "cli":
        from fairlane.cli.commands import cli  # noqa: PLC0415

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Entry point of the ``fairlane`` script."""
    _command_line(sys.argv[1:2])()


def _command_line(first: list[str]) -> typer.Typer:
    """The whole command line, or, to run a worker, the worker command alone.

    A worker started by a supervisor or an autoscaler is waiting for work while it
    imports: the other commands' modules (the gateway, the simulator, the dashboards'
    narratives) are a fifth of its import, so ``fairlane worker`` does without them.
    """
    if first == ["worker"]:
        from fairlane.cli._typer import fairlane_typer  # noqa: PLC0415
        from fairlane.cli.worker import worker  # noqa: PLC0415

        alone = fairlane_typer()
        alone.callback()(_group)
        alone.command(no_args_is_help=True)(worker)
        return alone
    from fairlane.cli.commands import cli  # noqa: PLC0415

    return cli


def _group() -> None:
    """The worker command's group: Typer would run a lone command as the whole program,
    and ``fairlane worker APP`` must parse as the whole command line does."""
