"""``fairlane simulate --help`` names every override a variant may carry, with the
values ``fairlane.sim.variants`` parses, and the example it gives runs."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from fairlane.cli.simulate import simulate
from fairlane.sim.variants import parse_variants

app = typer.Typer(add_completion=False)
app.command()(simulate)


def test_the_compare_help_names_every_override_and_its_example_parses() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    text = " ".join(re.sub(r"[│\s]+", " ", result.output).split())
    for override in ("slice=", "admission=on|off", "throttles=on|off", "classes=on|off"):
        assert override in text
    assert "charge=time|jobs|units" in text and "waiters=fair|fifo" in text
    example = re.search(r"'(waiters=[^']+)'", text)
    assert example is not None
    variants = parse_variants([example.group(1)])
    assert [(v.label, v.waiters) for v in variants] == [
        ("waiters=fair", "fair"),
        ("waiters=fifo", "fifo"),
    ]
