"""``fairlane simulate`` end to end: every shipped scenario runs, files are written.

The command function is mounted on a Typer app of its own here (the project's
``fairlane`` app registers it as ``fairlane simulate``). Each shipped scenario but
``million`` runs at ``--scale 0.01`` in well under a second; ``million`` is the
performance smoke's business (``test_perf.py``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fairlane.cli.simulate import simulate
from fairlane.sim import shipped

app = typer.Typer(add_completion=False)
app.command()(simulate)

SCENARIOS = sorted(name for name, _ in shipped() if name != "million")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "220"})
    return result.exit_code, result.output


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_shipped_scenario_runs_scaled_down(name: str) -> None:
    code, out = invoke(name, "--scale", "0.01")
    assert code == 0, out
    assert "Summary" in out and "Start delay by class" in out


def test_list_names_every_scenario() -> None:
    code, out = invoke("--list")
    assert code == 0
    for name, _ in shipped():
        assert name in out


def test_json_and_variants(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code, out = invoke(
        "long-jobs", "--scale", "0.05", "--compare", "slice=0.5,slice=inf", "-c", "fifo",
        "--json", str(report), "--tenants", "20", "--seed", "5",
    )  # fmt: skip
    assert code == 0, out
    assert "Start delay and share by tenant" in out  # 11 tenants <= --tenants 20
    data = json.loads(report.read_text())
    assert data["scenario"]["name"] == "long-jobs" and data["scenario"]["seed"] == 5
    assert [v["label"] for v in data["variants"]] == ["slice=0.5", "slice=inf", "fifo"]
    first = data["variants"][0]
    assert first["settings"]["slice"] == 0.5 and data["variants"][1]["settings"]["slice"] == "inf"
    assert {"p50", "p99", "max", "jobs"} <= set(first["groups"][0]["waits"])
    assert len(first["tenants"]) == 11 and first["series"]


def test_charts_are_svg(tmp_path: Path) -> None:
    chart = tmp_path / "c.svg"
    code, out = invoke("overload", "--scale", "0.05", "--chart", str(chart))
    assert code == 0, out
    for path in (chart, tmp_path / "c-queue.svg"):
        root = ET.parse(path).getroot()
        assert root.tag.endswith("svg")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-scenario"], "no scenario"),
        (["overload", "--compare", "lifo"], "not a policy"),
        (["noisy-neighbor", "--compare", "fair+admission=on"], "no lane has a"),
        (["overload", "--scale", "0"], "scale"),
        (["overload", "--workers", "0"], "--workers"),
        ([], "name a scenario"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2
    assert message in out
