"""One shape for a lane's classes, in lanes files and in config files alike.

Unit tests of ``fairlane.config.classes`` (the one reader), ``fairlane.config.legacy``
(the deprecated array shape) and ``fairlane.config.files`` (the one TOML reader), through
``load_lanes``, ``load_config`` and ``load_settings``. Pure: no server.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from fairlane import load_config, load_lanes
from fairlane.config import files, lanes, pools
from fairlane.config.lanes import parse_lanes
from fairlane.config.settings import ConfigError, load_settings
from fairlane.policy.classes import ClassTable, ServiceClass

CLASSES = """
[{table}.heavy.classes.interactive]
nominal_share = 0.7
min_slots = 2
lendable = 0.5
borrowable = 1.0
{bounds}
[{table}.heavy.classes.bulk]
batch = true
"""

TABLE = ClassTable(
    [
        ServiceClass("interactive", nominal_share=0.7, min_slots=2, lendable=0.5, borrowable=1.0),
        ServiceClass("bulk", batch=True),
    ]
)


def write(tmp_path: Path, text: str, name: str = "lanes.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_lane_and_a_pool_write_their_classes_the_same_way(tmp_path: Path) -> None:
    lane = write(tmp_path, CLASSES.format(table="lanes", bounds=""))
    pool = write(
        tmp_path,
        "[pools.heavy]\ncapacity_units = 10\n"
        + CLASSES.format(table="pools", bounds="min_units = 3\nmax_queue = 20"),
        "fairlane.toml",
    )
    assert load_lanes(lane) == {"heavy": TABLE}
    config = load_config(pool)
    assert config.pools["heavy"].table == TABLE
    assert [c.min_units for c in config.pools["heavy"].admission.classes] == [3.0, 0.0]


LANE_ERRORS = [
    ("[lanes.x.classes.c]\nmin_slots = 1.5\n", "lanes.x.classes.c.min_slots: must be an int >= 0"),
    ("[lanes.x.classes.c]\nmin_slots = true\n", "lanes.x.classes.c.min_slots: must be an int"),
    (
        "[lanes.x.classes.c]\nnominal_shares = 0.5\n",
        "lanes.x.classes.c.nominal_shares: unknown key; did you mean 'nominal_share'?",
    ),
    (
        "[lanes.x.classes.c]\nmax_queue = 5\n",
        "lanes.x.classes.c.max_queue: bounds the lane's admission pool, and this lane has none",
    ),
    (
        "[lanes.x.classes.c]\nbatch = true\nmin_slots = 1\n",
        "lanes.x.classes.c.min_slots: a batch class is assured nothing",
    ),
    ("[lanes.x.classes.c]\nbatch = 1\n", "lanes.x.classes.c.batch: must be true or false"),
    ("[lanes.x.classes.c]\nlendable = 2\n", "lanes.x.classes.c.lendable: must be within [0, 1]"),
    ("[lanes.x.classes.c]\nborrowable = inf\n", "lanes.x.classes.c.borrowable: must be a finite"),
    ("[lanes.x.classes.c]\nc = 1\n", "lanes.x.classes.c.c: unknown key"),
    ("[lanes.x.classes]\n", "lanes.x.classes: needs at least one class ([lanes.x.classes.<name>])"),
    ("[lanes.x.classes]\nc = 1\n", "lanes.x.classes.c: must be a table, got 1"),
    ('[lanes.x.classes."a b"]\n', 'lanes.x.classes."a b": class name must be non-empty'),
    (
        "[lanes.x.classes.a]\nnominal_share = 0.6\n[lanes.x.classes.b]\nnominal_share = 0.6\n",
        "lanes.x.classes: nominal shares of non-batch classes sum to 1.2 > 1",
    ),
    ("[lanes.x]\nclasses = 3\n", "lanes.x.classes must be a table per class"),
]


@pytest.mark.parametrize(("text", "message"), LANE_ERRORS)
def test_errors_in_a_lanes_file_name_the_file_and_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_lanes(path)
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


ARRAY = '[[lanes.old.classes]]\nname = "only"\n\n[lanes.new.classes.only]\n'


def test_the_array_shape_reads_the_same_with_a_warning_naming_its_lanes(tmp_path: Path) -> None:
    path = write(tmp_path, ARRAY)
    with pytest.warns(DeprecationWarning) as caught:
        tables = load_lanes(path)
    assert tables == {"old": ClassTable([ServiceClass("only")]), "new": tables["old"]}
    [warning] = caught
    message = str(warning.message)
    assert message.startswith(f"{path}: lane old writes its classes as an array of tables")
    assert "[lanes.old.classes.<name>]" in message and "new" not in message
    assert warning.filename == __file__  # the warning points at whoever read the file


def test_parsed_data_reads_the_array_shape_without_a_warning() -> None:
    data = {"lanes": {"old": {"classes": [{"name": "only"}]}, "new": {"classes": {"only": {}}}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tables = parse_lanes(data)
    assert tables["old"] == tables["new"] == ClassTable([ServiceClass("only")])


def test_a_broken_array_keeps_its_old_message_and_is_not_warned_of(tmp_path: Path) -> None:
    path = write(tmp_path, '[[lanes.x.classes]]\nname = "c"\nmin_slots = true\n')
    with pytest.raises(ConfigError, match=r"lanes\.x\.classes\[0\]\.min_slots must be an integer"):
        load_lanes(path)


def test_every_config_file_is_read_by_one_reader(tmp_path: Path) -> None:
    assert lanes.read_toml is files.read_toml and pools.read_toml is files.read_toml
    broken = "[lanes\n"
    for load, name in ((load_lanes, "lanes.toml"), (load_config, "config.toml")):
        path = write(tmp_path, broken, name)
        with pytest.raises(ConfigError, match=rf"^invalid TOML in {path}: "):
            load(path)
    write(tmp_path, broken, "fairlane.toml")
    with pytest.raises(ConfigError, match=rf"invalid TOML in {tmp_path / 'fairlane.toml'}: "):
        load_settings(project_dir=tmp_path, environ={})
