"""The ``fairlane`` Typer app's settings, shared by the whole command line
(``commands.py``) and the worker's own (``fairlane.cli.main``)."""

from __future__ import annotations

import typer

__all__ = ["fairlane_typer"]


def fairlane_typer() -> typer.Typer:
    """An empty ``fairlane`` app, as every command line of Fairlane's is made."""
    return typer.Typer(
        name="fairlane",
        help="Fairlane: a fair, bounded, durable task queue on Redis or Valkey.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,  # locals may hold server passwords
    )
