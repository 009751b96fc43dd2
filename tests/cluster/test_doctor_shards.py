"""``fairlane doctor MODULE:APP`` on the session's 3-primary cluster: how the app's
scheduling shards fall on the primaries. Fewer shards than primaries leave a primary
idle, a count that is not a multiple of the primaries loads them unevenly: both are a
WARN naming the count to use; three shards are even."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairlane.cli import cli

pytestmark = [
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]

APP_SOURCE = """
from fairlane import App

app = App({name!r}, redis_url={url!r}, shards={shards})
"""


# A shard's keys fall somewhere in its own part of the slots, which of 2 or 4 parts
# straddles two primaries' ranges: which primary it lands on depends on the app's name.
# Any 2 shards leave a primary idle; 4 leave one idle or load one twice.
IDLE = ("primary does none of its scheduling", "primaries do none of its scheduling")
UNEVEN = ("uneven, the primaries with more shards carry more of its scheduling",)


@pytest.mark.parametrize(
    ("shards", "level", "said"),
    [(2, "WARN", IDLE), (3, "OK", ("even",)), (4, "WARN", IDLE + UNEVEN)],
)
def test_doctor_says_how_the_apps_shards_fall_on_the_primaries(  # noqa: PLR0917 - fixtures and parameters
    tmp_path: Path,
    namespace: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    shards: int,
    level: str,
    said: tuple[str, ...],
) -> None:
    module = f"doc_{namespace}_{shards}"
    source = APP_SOURCE.format(name=namespace, url=redis_url, shards=shards)
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    result = CliRunner().invoke(
        cli, ["doctor", f"{module}:app", "--redis-url", redis_url], env={"COLUMNS": "300"}
    )
    print(result.output)
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if line.split()[1:2] == ["shards"]]
    assert row.split()[0] == level, row
    text = " ".join(result.output.split())  # a long finding folds over lines
    assert f"{shards} shard(s) on 3 primaries" in row, row
    assert any(phrase in text for phrase in said), row
    if level == "WARN":
        assert "give the app shards=3 (as many as primaries) or a multiple of it" in text
