"""Unit tests of ``fairlane.config.pools``: the seed's pools config in TOML and Python, its checks.

Pure: no server.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fairlane import App
from fairlane.config.pools import FairlaneConfig, Pool, RetrySettings, load_config, parse_config
from fairlane.config.settings import ConfigError
from fairlane.policy.admission import (
    AdmissionClass,
    Coefficients,
    EstimationSettings,
    PoolConfig,
    RetryAfterPolicy,
)
from fairlane.policy.backoff import Backoff
from fairlane.policy.classes import ClassTable, ServiceClass

SEED = """
[pools.agent-shared]
capacity_units = 100
recovery_reserve_units = 5

[pools.agent-shared.classes.guaranteed]
nominal_share = 0.50
min_units = 30
max_queue = 200
response_when_full = "reject"

[pools.agent-shared.classes.standard]
nominal_share = 0.35
min_units = 20
max_queue = 500
response_when_full = "defer"

[pools.agent-shared.classes.batch]
nominal_share = 0.15
min_units = 5
max_queue = 1000
response_when_full = "defer"

[retry]
max_attempts = 6
base_seconds = 2
max_seconds = 120
jitter = "full"

[estimation]
max_reservation_units = 40
update_window = 500
safety_multiplier = 1.25

[estimation.coefficients]
per_1k_tokens = 1.0
per_tool_call = 0.25
per_tool_second = 0.1

[estimation.coefficients.models]
"big-model" = 3.0
"""

EXPECTED_TABLE = ClassTable(
    [
        ServiceClass("guaranteed", nominal_share=0.5),
        ServiceClass("standard", nominal_share=0.35),
        ServiceClass("batch", nominal_share=0.15),
    ]
)
EXPECTED_ADMISSION = PoolConfig(
    100.0,
    (
        AdmissionClass("guaranteed", min_units=30.0, max_queue=200, when_full="reject"),
        AdmissionClass("standard", min_units=20.0, max_queue=500, when_full="defer"),
        AdmissionClass("batch", min_units=5.0, max_queue=1000, when_full="defer"),
    ),
    recovery_reserve_units=5.0,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fairlane-pools.toml"
    path.write_text(text)
    return path


def seed() -> dict[str, Any]:
    return tomllib.loads(SEED)


def broken(path: str, value: object) -> dict[str, Any]:
    """The seed with the value at dotted ``path`` replaced (``...`` deletes it)."""
    data = copy.deepcopy(seed())
    *parents, leaf = path.split("/")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    if value is ...:
        del node[leaf]
    else:
        node[leaf] = value
    return data


# -- the seed example ------------------------------------------------------------------------


def test_the_seed_example_loads_into_both_tables(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SEED))
    pool = config.pools["agent-shared"]
    assert pool == Pool("agent-shared", EXPECTED_TABLE, EXPECTED_ADMISSION)
    assert pool.table.names == ("guaranteed", "standard", "batch")
    assert [c.min_slots for c in pool.unit_table] == [30_000, 20_000, 5_000]
    assert config.retry == RetrySettings(6, 2.0, 120.0, "full")
    assert config.retry.backoff == Backoff(2.0, 120.0, "full")
    assert config.retry.retry_after_policy == RetryAfterPolicy(2.0, 120.0)
    assert config.estimation == EstimationSettings(40.0, 500, 1.25)
    assert config.coefficients == Coefficients(1.0, 0.25, 0.1, {"big-model": 3.0})
    assert config.lane_tables() == {"agent-shared": EXPECTED_TABLE}


def test_toml_and_an_equivalent_python_mapping_give_the_same_config(tmp_path: Path) -> None:
    built = FairlaneConfig(
        pools={"agent-shared": Pool("agent-shared", EXPECTED_TABLE, EXPECTED_ADMISSION)},
        retry=RetrySettings(),
        estimation=EstimationSettings(),
        coefficients=Coefficients(models={"big-model": 3.0}),
    )
    assert load_config(write(tmp_path, SEED)) == built
    assert parse_config(seed()) == built


def test_everything_is_optional_but_a_pools_capacity_and_classes() -> None:
    assert parse_config({}) == FairlaneConfig()
    config = parse_config({"pools": {"p": {"capacity_units": 1, "classes": {"standard": {}}}}})
    assert config.pools["p"].admission == PoolConfig(1.0, (AdmissionClass("standard"),))
    assert config.pools["p"].table == ClassTable([ServiceClass("standard")])


def test_every_class_key_is_read() -> None:
    body = {
        "capacity_units": 10,
        "classes": {
            "interactive": {
                "nominal_share": 0.7,
                "min_slots": 2,
                "lendable": 0.5,
                "borrowable": 1,
                "min_units": 1.5,
                "max_queue": 10,
                "max_queue_units": 8,
                "tenant_max_queue": 3,
                "tenant_max_queue_units": 4,
                "max_deferred": 4,
                "response_when_full": "defer",
            },
            "bulk": {"batch": True, "lendable": 1.0},
        },
    }
    pool = parse_config({"pools": {"heavy": body}}).pools["heavy"]
    assert pool.table == ClassTable(
        [
            ServiceClass("interactive", 0.7, min_slots=2, lendable=0.5, borrowable=1.0),
            ServiceClass("bulk", batch=True),
        ]
    )
    assert pool.admission.classes == (
        AdmissionClass("interactive", 1.5, 10, 8.0, 3, 4, "defer", 4.0),
        AdmissionClass("bulk"),
    )


def test_pools_built_in_python_are_checked() -> None:
    table = ClassTable([ServiceClass("standard", 1.0)])
    with pytest.raises(ValueError, match="not classes of the lane"):
        Pool("p", table, PoolConfig(1.0, (AdmissionClass("vip"),)))
    with pytest.raises(ValueError, match="lane name"):
        Pool("a b", table, PoolConfig(1.0))
    with pytest.raises(ValueError, match="must be a Pool named"):
        FairlaneConfig(pools={"q": Pool("p", table, PoolConfig(1.0))})
    with pytest.raises(ValueError):
        RetrySettings(max_attempts=0)
    with pytest.raises(TypeError):
        RetrySettings(max_attempts=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RetrySettings(jitter="some")  # type: ignore[arg-type]


# -- files -----------------------------------------------------------------------------------


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid TOML in .*fairlane-pools\.toml"):
        load_config(write(tmp_path, "[pools\n"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")
    path = write(tmp_path, SEED.replace("max_queue = 200", "max_queue = -1"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: pools.agent-shared.classes.guaranteed.max_queue: must be an int >= 0, got -1"
    )


# -- every validation error ------------------------------------------------------------------

G = "pools/agent-shared/classes/guaranteed"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("colour", 1, r"config: colour: unknown key \(keys: pools, retry, estimation\)"),
        ("pool", {}, r"pool: unknown key; did you mean 'pools'\?"),
        ("pools", [], r"pools: must be a table of pools"),
        ("pools/a:b", {}, r'pools\."a:b": lane name must be'),
        ("pools/a.b", 3, r'pools\."a\.b": must be a table, got 3'),
        ("pools/agent-shared/capacity", 1, r"capacity: unknown key; did you mean 'capacity_units'"),
        ("pools/agent-shared/capacity_units", ..., r"agent-shared\.capacity_units: is required"),
        ("pools/agent-shared/capacity_units", 0, r"capacity_units: must be a finite number > 0"),
        ("pools/agent-shared/capacity_units", "100", r"capacity_units: must be a finite number"),
        ("pools/agent-shared/capacity_units", float("inf"), r"capacity_units: must be a finite"),
        ("pools/agent-shared/recovery_reserve_units", 101, r"must be at most capacity_units"),
        ("pools/agent-shared/recovery_reserve_units", -1, r"reserve_units: must be a finite num"),
        ("pools/agent-shared/classes", ..., r"agent-shared\.classes: needs at least one class"),
        ("pools/agent-shared/classes", {}, r"agent-shared\.classes: needs at least one class"),
        (f"{G}", 1, r"classes\.guaranteed: must be a table, got 1"),
        (f"{G}/max_queues", 1, r"guaranteed\.max_queues: unknown key; did you mean 'max_queue'"),
        (f"{G}/max_queue", 2.5, r"guaranteed\.max_queue: must be an int >= 0, got 2\.5"),
        (f"{G}/max_queue", True, r"guaranteed\.max_queue: must be an int >= 0, got True"),
        (f"{G}/max_queue", 2**40, r"guaranteed\.max_queue: must be an int >= 0"),
        (f"{G}/tenant_max_queue", -2, r"guaranteed\.tenant_max_queue: must be an int >= 0"),
        (f"{G}/max_deferred", "x", r"guaranteed\.max_deferred: must be an int >= 0"),
        (f"{G}/min_slots", 1.0, r"guaranteed\.min_slots: must be an int >= 0"),
        (f"{G}/max_queue_units", -1, r"guaranteed\.max_queue_units: must be a finite number"),
        (f"{G}/min_units", "30", r"guaranteed\.min_units: must be a finite number >= 0"),
        (f"{G}/nominal_share", 1.5, r"guaranteed\.nominal_share: must be within \[0, 1\]"),
        (f"{G}/nominal_share", 0.6, r"agent-shared\.classes: nominal shares .* sum to 1\.1 > 1"),
        (f"{G}/lendable", 2, r"guaranteed\.lendable: must be within \[0, 1\]"),
        (f"{G}/borrowable", -1, r"guaranteed\.borrowable: must be a finite number >= 0"),
        (f"{G}/response_when_full", "drop", r"response_when_full: must be one of reject, defer"),
        (f"{G}/batch", "yes", r"guaranteed\.batch: must be true or false, got 'yes'"),
        (f"{G}/batch", True, r"guaranteed\.nominal_share: a batch class is assured nothing"),
        ("retry/max_attempts", 0, r"retry\.max_attempts: must be an int >= 1, got 0"),
        ("retry/base_seconds", -2, r"retry\.base_seconds: must be a finite number >= 0"),
        ("retry/max_seconds", 0.5, r"retry: max_seconds must be finite and within \[1\.0"),
        ("retry/jitter", "half", r"retry\.jitter: must be one of full, equal, none"),
        ("retry/attempts", 3, r"retry\.attempts: unknown key"),
        ("retry", [], r"config: retry: must be a table"),
        ("estimation/update_window", 0, r"estimation\.update_window: must be an int >= 1"),
        ("estimation/safety_multiplier", 0.5, r"estimation: safety_multiplier must be finite"),
        ("estimation/window", 1, r"estimation\.window: unknown key; did you mean 'update_window'"),
        ("estimation/coefficients/per_token", 1, r"coefficients\.per_token: unknown key"),
        ("estimation/coefficients/per_tool_call", -1, r"coefficients\.per_tool_call: must be"),
        ("estimation/coefficients/models", 3, r"coefficients\.models: must be a table"),
        (
            "estimation/coefficients/models/big-model",
            -3,
            r"coefficients\.models\.big-model: must be a finite number >= 0",
        ),
        (
            "estimation/coefficients/models/org/model",
            1,
            r'coefficients\.models\."org/model": must be a finite number >= 0',
        ),
    ],
)
def test_invalid_configs_name_the_key(path: str, value: object, message: str) -> None:
    if path == "estimation/coefficients/models/org/model":
        data = seed()
        data["estimation"]["coefficients"]["models"]["org/model"] = {"nested": 1}
    else:
        data = broken(path, value)
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_a_batch_class_must_leave_its_share_and_floors_out() -> None:
    for key, value in (
        ("nominal_share", 0.1),
        ("min_units", 1),
        ("min_slots", 1),
        ("borrowable", 1),
    ):
        body = {"capacity_units": 1, "classes": {"bulk": {"batch": True, key: value}}}
        with pytest.raises(ConfigError, match=rf"pools\.p\.classes\.bulk\.{key}: a batch class"):
            parse_config({"pools": {"p": body}})
    ok = {"capacity_units": 1, "classes": {"bulk": {"batch": True, "nominal_share": 0}}}
    assert parse_config({"pools": {"p": ok}}).pools["p"].table["bulk"].batch


def test_a_configs_retry_section_gives_tasks_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "fairlane.toml"
    path.write_text("[retry]\nmax_attempts = 6\nbase_seconds = 2\nmax_seconds = 30\n")
    app = App("cfg", config=path)

    @app.task
    async def by_default() -> None: ...

    @app.task(attempts=2)
    async def own() -> None: ...

    assert by_default.options.attempts == 6
    assert by_default.options.backoff == Backoff(2.0, 30.0, "full")
    assert own.options.attempts == 2
    assert app.pricing.retry == RetryAfterPolicy(2.0, 30.0)
