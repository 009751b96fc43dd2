"""Unit tests of ``fairlane.config.lanes``: lane tables in Python and TOML, per-job option checks.

Pure: no server. The App-level behaviour (declaring on connect, refusing enqueues) is
tested end to end in ``tests/e2e/test_api.py``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fairlane import DEFAULT_CLASSES, App, ClassTable, ServiceClass, load_lanes
from fairlane.cli import cli
from fairlane.config.lanes import LaneTables, check_lane, class_table, parse_lanes
from fairlane.config.settings import ConfigError, load_settings
from fairlane.registry.calls import (
    MAX_LIMIT_KEYS,
    check_limits,
    check_service_class,
    check_slots,
    merge_limits,
)

HEAVY = """
[lanes.heavy.classes.interactive]
nominal_share = 0.7
min_slots = 2
lendable = 0.5
borrowable = 1.0

[lanes.heavy.classes.bulk]
batch = true

[lanes.light.classes.standard]
nominal_share = 1
"""

# the lanes file's first shape, still read with a DeprecationWarning
HEAVY_ARRAY = """
[[lanes.heavy.classes]]
name = "interactive"
nominal_share = 0.7
min_slots = 2
lendable = 0.5
borrowable = 1.0

[[lanes.heavy.classes]]
name = "bulk"
batch = true

[[lanes.light.classes]]
name = "standard"
nominal_share = 1
"""


def write(tmp_path: Path, text: str, name: str = "lanes.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def deprecated_if_array(text: str) -> AbstractContextManager[object]:
    """Expect the array shape's DeprecationWarning where ``text`` is written in it."""
    if "[[lanes." in text:
        return pytest.warns(DeprecationWarning, match=r"\[lanes\.heavy\.classes\.<name>\]")
    return nullcontext()  # and no warning at all: pytest makes any an error


SHAPES = pytest.mark.parametrize("text", [HEAVY, HEAVY_ARRAY], ids=["tables", "array"])


# -- TOML ----------------------------------------------------------------------------------------


@SHAPES
def test_load_lanes_reads_every_field(tmp_path: Path, text: str) -> None:
    with deprecated_if_array(text):
        tables = load_lanes(write(tmp_path, text))
    assert list(tables) == ["heavy", "light"]
    assert tables["heavy"] == ClassTable(
        [
            ServiceClass(
                "interactive", nominal_share=0.7, min_slots=2, lendable=0.5, borrowable=1.0
            ),
            ServiceClass("bulk", batch=True),
        ]
    )
    assert tables["light"].names == ("standard",)
    assert tables["light"]["standard"].nominal_share == 1.0
    assert tables["light"]["standard"].borrowable is None  # left out: may borrow up to C


def test_an_empty_file_declares_no_lanes(tmp_path: Path) -> None:
    assert load_lanes(write(tmp_path, "")) == {}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[lanes.x]\n", "exactly one key, 'classes'"),
        ("[lanes.x]\nclasses = 3\n", "array of tables"),
        ("[lanes.x]\nclasses = []\n", "at least one class"),
        ("[lanes.x]\nclassses = []\n", "exactly one key"),
        ("[lane.x]\n", "unknown top-level keys"),
        ("lanes = 1\n", "table of lanes"),
        ('[[lanes."a:b".classes]]\nname = "c"\n', r"lanes\.a:b: lane name"),
        ("[[lanes.x.classes]]\nnominal_share = 0.5\n", "needs a name"),
        ('[[lanes.x.classes]]\nname = "c"\nnominal_shares = 0.5\n', "did you mean 'nominal_share'"),
        ('[[lanes.x.classes]]\nname = "c"\nmin_slots = 1.5\n', r"classes\[0\]\.min_slots"),
        ('[[lanes.x.classes]]\nname = "c"\nmin_slots = true\n', "min_slots must be an integer"),
        ('[[lanes.x.classes]]\nname = "c"\nlendable = "all"\n', "lendable must be a finite"),
        ('[[lanes.x.classes]]\nname = "c"\nborrowable = inf\n', "borrowable must be a finite"),
        ('[[lanes.x.classes]]\nname = "c"\nbatch = 1\n', "batch must be true or false"),
        ("[[lanes.x.classes]]\nname = 7\n", "name must be a string"),
        ('[[lanes.x.classes]]\nname = "c"\nnominal_share = 1.5\n', r"within \[0, 1\]"),
        ('[[lanes.x.classes]]\nname = "a b"\n', "class name"),
        (
            '[[lanes.x.classes]]\nname = "b"\nbatch = true\nmin_slots = 1\n',
            "must have nominal_share 0",
        ),
        (
            '[[lanes.x.classes]]\nname = "a"\n[[lanes.x.classes]]\nname = "a"\n',
            r"lanes\.x: class names must be unique",
        ),
        (
            '[[lanes.x.classes]]\nname = "a"\nnominal_share = 0.6\n'
            '[[lanes.x.classes]]\nname = "b"\nnominal_share = 0.6\n',
            "sum to 1.2 > 1",
        ),
    ],
)
def test_bad_lane_files_name_the_entry(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        load_lanes(path)
    assert str(path) in str(info.value)


def test_unreadable_or_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read lanes file"):
        load_lanes(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_lanes(write(tmp_path, "[lanes\n"))


def test_parse_lanes_takes_parsed_data() -> None:
    data: dict[str, Any] = {"lanes": {"gpu": {"classes": [{"name": "only", "min_slots": 1}]}}}
    assert parse_lanes(data)["gpu"] == ClassTable([ServiceClass("only", min_slots=1)])


# -- lanes declared on an App --------------------------------------------------------------------


@SHAPES
def test_lanes_from_python_and_from_the_lanes_file_setting(tmp_path: Path, text: str) -> None:
    write(tmp_path, text)
    settings = load_settings(project_dir=tmp_path, environ={}, lanes_file="lanes.toml")
    assert settings.lanes_file == tmp_path / "lanes.toml"  # relative to the project
    gpu = [ServiceClass("train", nominal_share=0.5), ServiceClass("infer", nominal_share=0.5)]
    with deprecated_if_array(text):
        app = App("lanes", settings=settings, lanes={"gpu": gpu})
    app.lane("cpu", classes=ClassTable([ServiceClass("only", nominal_share=1.0)]))
    assert list(app.lanes) == ["heavy", "light", "gpu", "cpu"]
    assert app.lane_classes("gpu") == ClassTable(gpu)
    assert app.lane_classes("undeclared") == ClassTable(DEFAULT_CLASSES)
    with pytest.raises(ValueError, match=r"already declared \(by lanes_file"):
        app.lane("heavy", classes=DEFAULT_CLASSES)


@SHAPES
def test_lanes_file_from_the_environment(tmp_path: Path, text: str) -> None:
    write(tmp_path, text, "ops.toml")
    settings = load_settings(project_dir=tmp_path, environ={"FAIRLANE_LANES_FILE": "ops.toml"})
    with deprecated_if_array(text):
        app = App("envlanes", settings=settings)
    assert set(app.lanes) == {"heavy", "light"}


def test_a_missing_lanes_file_fails_when_the_app_is_built(tmp_path: Path) -> None:
    settings = load_settings(project_dir=tmp_path, environ={}, lanes_file="nope.toml")
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        App("missing", settings=settings)


def test_task_classes_are_checked_against_declared_lanes() -> None:
    settings = load_settings(environ={})
    app = App("classes", settings=settings, lanes={"gpu": [ServiceClass("train", min_slots=1)]})

    async def fn() -> None: ...

    with pytest.raises(ValueError, match=r"lane 'gpu' has no service class 'standard'.*train"):
        app.task(name="a", lane="gpu")(fn)
    app.task(name="b", lane="gpu", service_class="train")(fn)
    # declared after its tasks: they are checked then, and a refused lane is not kept
    app.task(name="c", lane="later", service_class="bulk")(fn)
    with pytest.raises(ValueError, match="task c: lane 'later' has no service class 'bulk'"):
        app.lane("later", classes=[ServiceClass("other")])
    assert "later" not in app.lanes
    # never declared: checked against the defaults when the app connects
    with pytest.raises(ValueError, match="its default classes are guaranteed, standard, batch"):
        app.check_lanes()
    app.lane("later", classes=[ServiceClass("bulk", batch=True)])
    app.check_lanes()


def test_lane_declarations_are_checked() -> None:
    tables = LaneTables()
    with pytest.raises(ValueError, match="lane name"):
        tables.declare("a:b", DEFAULT_CLASSES, source="test")
    with pytest.raises(ValueError, match="lane name"):
        tables.declare("", DEFAULT_CLASSES, source="test")
    with pytest.raises(TypeError, match="ServiceClass"):
        tables.declare("x", ["standard"], source="test")  # type: ignore[list-item]
    with pytest.raises(TypeError, match="ClassTable"):
        tables.declare("x", "standard", source="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one class"):
        tables.declare("x", [], source="test")
    assert len(tables) == 0
    assert class_table(DEFAULT_CLASSES) == ClassTable()
    assert check_lane("heavy-1.gpu") == "heavy-1.gpu"


# -- per-job options -----------------------------------------------------------------------------


def test_slots() -> None:
    assert check_slots(1) == 1 and check_slots(64) == 64
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="slots"):
            check_slots(bad)
    for wrong in (True, 1.0, "2", None):
        with pytest.raises(TypeError, match="slots must be an int"):
            check_slots(wrong)


def test_service_class_form() -> None:
    assert check_service_class("batch") == "batch"
    for wrong in ("", None, 3):
        with pytest.raises(TypeError, match="service_class"):
            check_service_class(wrong)


def test_limits_are_checked_and_sorted() -> None:
    assert check_limits(None) == ()
    assert check_limits({}) == ()
    assert check_limits({"sub:acme/u42": 2, "doc:884": 4, "x": 0}) == (
        ("doc:884", 4),
        ("sub:acme/u42", 2),
        ("x", 0),
    )
    assert check_limits({"k" * 200: 1}) == (("k" * 200, 1),)


@pytest.mark.parametrize(
    ("limits", "error", "match"),
    [
        ({"": 1}, ValueError, "non-empty"),
        ({"a\nb": 1}, ValueError, "newlines"),
        ({"a\0b": 1}, ValueError, "NUL"),
        ({"k" * 201: 1}, ValueError, "at most 200"),
        ({3: 1}, ValueError, "limit keys"),
        ({"tenant:acme": 5}, ValueError, "reserved for tenants"),
        ({"pool:default": 5}, ValueError, "reserved for admission pools"),
        ({"doc:1": -1}, ValueError, ">= 0"),
        ({"doc:1": True}, TypeError, "must be an int"),
        ({"doc:1": 1.5}, TypeError, "must be an int"),
        ({f"k{i}": 1 for i in range(MAX_LIMIT_KEYS + 1)}, ValueError, "at most 16"),
        ([("doc:1", 1)], TypeError, "mapping"),
    ],
)
def test_bad_limits(limits: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_limits(limits)


def test_merge_limits_adds_the_call_to_the_task() -> None:
    task = check_limits({"model:big": 50, "doc:1": 4})
    assert merge_limits(task, ()) == task
    assert merge_limits((), task) == task
    assert merge_limits(task, check_limits({"doc:1": 2, "user:7": 1})) == (
        ("doc:1", 2),
        ("model:big", 50),
        ("user:7", 1),
    )
    many = check_limits({f"k{i:02}": 1 for i in range(MAX_LIMIT_KEYS)})
    with pytest.raises(ValueError, match="together name 17"):
        merge_limits(many, check_limits({"extra": 1}))


def test_task_options_are_checked_at_declaration() -> None:
    app = App("declared", settings=load_settings(environ={}))

    async def fn() -> None: ...

    with pytest.raises(TypeError, match="task t: slots must be an int"):
        app.task(name="t", slots=True)(fn)
    with pytest.raises(ValueError, match="task t: slots must be at least 1"):
        app.task(name="t", slots=0)(fn)
    with pytest.raises(ValueError, match=r"task t: .*reserved"):
        app.task(name="t", limits={"tenant:x": 1})(fn)
    with pytest.raises(TypeError, match="task t: service_class"):
        app.task(name="t", service_class="")(fn)
    with pytest.raises(ValueError, match="task t: lane name"):
        app.task(name="t", lane="a b")(fn)

    async def has_slots(slots: int) -> None: ...

    with pytest.raises(ValueError, match="reserved"):
        app.task(has_slots)
    task = app.task(name="t", slots=2, limits={"b": 1, "a": 2}, service_class="batch")(fn)
    assert (task.options.slots, task.options.limits) == (2, (("a", 2), ("b", 1)))
    assert task.options.service_class == "batch"
    assert {"service_class", "slots", "limits"}.isdisjoint(task.options.defaults)
    plain = app.task(name="plain")(fn)
    assert {"service_class", "slots", "limits"} <= plain.options.defaults
    assert (plain.options.service_class, plain.options.slots, plain.options.limits) == (
        "standard",
        1,
        (),
    )
    assert app.tasks.keys() == {"t", "plain"}


def test_inspect_lanes_prints_declared_and_default_tables() -> None:
    result = CliRunner().invoke(
        cli, ["inspect", "lanes", "fairlane.example:app"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "light (default)" in line]
    assert [row.split("│")[2].strip() for row in rows] == ["guaranteed", "standard", "batch"]
    # guaranteed is the restricted one: only entitled tenants may use it
    assert [row.split("│")[8].strip() for row in rows] == ["yes", "no", "no"]
