"""A class's ``max_wait`` (aging) as the config files write it: in a lanes file, in a
config file's pool, in the deprecated array shape, and the errors a wrong one gives.
Pure: no server."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from fairlane import load_config, load_lanes
from fairlane.config.settings import ConfigError

LANE = """
[lanes.heavy.classes.standard]
nominal_share = 1.0

[lanes.heavy.classes.bulk]
batch = true
max_wait = {value}
"""


def write(tmp_path: Path, text: str, name: str = "lanes.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("value", "seconds"), [('"12h"', 43200.0), ('"90s"', 90.0), ("30", 30.0)])
def test_a_lanes_file_declares_max_wait(tmp_path: Path, value: str, seconds: float) -> None:
    table = load_lanes(write(tmp_path, LANE.format(value=value)))["heavy"]
    assert table["bulk"].max_wait == seconds
    assert table["standard"].max_wait is None


def test_a_pool_declares_max_wait(tmp_path: Path) -> None:
    text = "[pools.heavy]\ncapacity_units = 10\n" + LANE.format(value='"1h"').replace(
        "[lanes.", "[pools."
    )
    config = load_config(write(tmp_path, text, "fairlane.toml"))
    assert config.pools["heavy"].table["bulk"].max_wait == 3600.0


def test_the_array_shape_reads_max_wait(tmp_path: Path) -> None:
    text = (
        '[[lanes.heavy.classes]]\nname = "standard"\nnominal_share = 1.0\n'
        '[[lanes.heavy.classes]]\nname = "bulk"\nbatch = true\nmax_wait = "5m"\n'
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        table = load_lanes(write(tmp_path, text))["heavy"]
    assert table["bulk"].max_wait == 300.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"soon"', "lanes.heavy.classes.bulk.max_wait: must be a duration"),
        ("true", "lanes.heavy.classes.bulk.max_wait: must be a duration"),
        ("0", "lanes.heavy.classes.bulk.max_wait: must be > 0"),
        ("[1]", "lanes.heavy.classes.bulk.max_wait: must be a duration"),
    ],
)
def test_a_wrong_max_wait_names_its_key(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_lanes(write(tmp_path, LANE.format(value=value)))


def test_the_first_class_cannot_age(tmp_path: Path) -> None:
    text = '[lanes.heavy.classes.standard]\nnominal_share = 1.0\nmax_wait = "1h"\n'
    with pytest.raises(ConfigError, match="declared first"):
        load_lanes(write(tmp_path, text))
