"""Tests for fairlane.config: sources, precedence, origins and validation errors."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
from pathlib import Path

import pytest
from pydantic import BaseModel

import fairlane.config
from fairlane.config.settings import (
    ConfigError,
    LeaseSettings,
    SettingOrigin,
    Settings,
    WorkerSettings,
    explain_settings,
    load_settings,
)

PYPROJECT_LABEL = "pyproject.toml [tool.fairlane]"


def _settings_models() -> list[type[BaseModel]]:
    """Every model the settings are built of: the ``BaseModel`` classes fairlane.config
    defines."""
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.iter_modules(fairlane.config.__path__, "fairlane.config."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseModel)
                and value.__module__ == module.__name__
            ):
                found[value.__qualname__] = value
    return [found[name] for name in sorted(found)]


def write_toml(project: Path, text: str) -> None:
    (project / "fairlane.toml").write_text(text)


def write_pyproject(project: Path, text: str) -> None:
    (project / "pyproject.toml").write_text('[project]\nname = "app"\n\n' + text)


def origins(project: Path, environ: dict[str, str], **overrides: object) -> dict[str, str]:
    rows = explain_settings(project_dir=project, environ=environ, **overrides)
    return {row.key: row.source for row in rows}


def test_defaults(tmp_path: Path) -> None:
    settings = load_settings(project_dir=tmp_path, environ={})
    assert settings.redis_url is None
    assert settings.max_payload_bytes == 1_048_576
    assert settings.default_lane == "default"
    assert settings.lease == LeaseSettings()
    assert settings.lease.duration == 30.0
    assert settings.lease.renew_interval == 10.0
    assert settings.lease.sweep_interval == 5.0
    assert settings.lease.sweep_jitter == 0.25
    assert settings.lease.sweep_batch == 200
    assert settings.worker == WorkerSettings()
    assert settings.worker.concurrency == 50
    assert settings.worker.lanes == ["default"]
    assert settings.worker.fetch_batch == 100
    assert settings.worker.grace_period == 30.0
    assert settings.worker.idle_block == 5.0
    assert settings.worker.health_port is None
    assert settings.worker.loop_block_threshold == 2.0
    assert settings.worker.thread_pool_size == 32
    assert settings.worker.process_pool_size == 0
    assert settings.server.state_dir is None
    assert settings.server.binary is None


# variables as users write them, read by pydantic-settings' own source (the convention the
# settings keep) and by Fairlane's: both must give the same settings
_CONVENTION_CASES = [
    {"FAIRLANE_LEASE__DURATION": "25"},
    {"fairlane_lease__duration": "25", "FAIRLANE_REDIS_URL": "redis://h:1/2"},
    {"FAIRLANE_LEASE": '{"duration": 40, "renew_interval": 9}'},
    {"FAIRLANE_LEASE": '{"duration": 40}', "FAIRLANE_LEASE__DURATION": "41"},
    # lanes as a comma list is Fairlane's own reading (test_comma_separated_lanes_from_env)
    {"FAIRLANE_WORKER__LANES": '["a", "b"]', "FAIRLANE_WORKER__CONCURRENCY": "7"},
    {"FAIRLANE_WORKER__PRESSURE__ENABLED": "false"},
    {"FAIRLANE_WORKER": '{"concurrency": 3}', "FAIRLANE_WORKER__PRESSURE": '{"enabled": false}'},
    {"FAIRLANE_FRONT_DOOR__TENANT_RATE": "none", "FAIRLANE_FRONT_DOOR__SEATS": "3"},
    {"FAIRLANE_FRONT_DOOR__TENANTS": '{"acme": {"rate": 2, "burst": 4}}'},
    {
        "FAIRLANE_FRONT_DOOR__TENANTS__ACME__RATE": "5",
        "FAIRLANE_FRONT_DOOR__TENANTS__B__BURST": "2",
    },
    {
        "FAIRLANE_FRONT_DOOR__TENANTS": '{"x": {"rate": 2}}',
        "FAIRLANE_FRONT_DOOR__TENANTS__X__BURST": "3",
    },
    {"FAIRLANE_QUEUES__TENANT_MAX_QUEUED": "none", "FAIRLANE_SHARDS": "4"},
    {"FAIRLANE_HOME": "/srv", "OTHER": "1", "FAIRLANE_DEFAULT_LANE": "fast"},
]


@pytest.mark.parametrize("environ", _CONVENTION_CASES)
def test_environment_is_read_as_pydantic_settings_reads_it(
    tmp_path: Path, environ: dict[str, str]
) -> None:
    sources = pytest.importorskip("pydantic_settings.sources")
    twin = sources.EnvSettingsSource(
        Settings,  # type: ignore[arg-type]  # any model's fields; the options given here
        case_sensitive=False,
        env_prefix="FAIRLANE_",
        env_nested_delimiter="__",
    )
    twin.env_vars = {k.lower(): v for k, v in environ.items()}
    expected = Settings.model_validate(twin())
    assert load_settings(project_dir=tmp_path, environ=environ) == expected


def _described_fields(model: type[BaseModel]) -> set[str]:
    """The fields of ``model`` that its own source follows with a docstring."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(model)))  # type: ignore[arg-type]
    body = next(
        node.body
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == model.__name__
    )
    return {
        field.target.id
        for field, after in itertools.pairwise(body)
        if isinstance(field, ast.AnnAssign)
        and isinstance(field.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }


@pytest.mark.parametrize("model", _settings_models(), ids=lambda m: m.__name__)
def test_every_field_is_described(model: type[BaseModel]) -> None:
    described = _described_fields(model)
    for name in model.model_fields:
        assert name in described, f"{model.__name__}.{name} has no docstring"


def test_default_project_dir_is_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, "default_lane = 'from-cwd'\n")
    monkeypatch.chdir(tmp_path)
    assert load_settings(environ={}).default_lane == "from-cwd"


def test_project_dir_may_be_a_string(tmp_path: Path) -> None:
    write_toml(tmp_path, "default_lane = 'str-dir'\n")
    assert load_settings(project_dir=str(tmp_path), environ={}).default_lane == "str-dir"


def test_environ_defaults_to_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRLANE_WORKER__CONCURRENCY", "9")
    assert load_settings(project_dir=tmp_path).worker.concurrency == 9


# Each source, with the value it gives worker.concurrency, highest precedence first.
SOURCES = ["argument", "env", "fairlane.toml", "pyproject", "default"]
VALUES = {"argument": 1, "env": 2, "fairlane.toml": 3, "pyproject": 4, "default": 50}


def apply_source(name: str, project: Path, environ: dict[str, str]) -> dict[str, object]:
    """Make source ``name`` set worker.concurrency; return keyword overrides to pass."""
    value = VALUES[name]
    if name == "env":
        environ["FAIRLANE_WORKER__CONCURRENCY"] = str(value)
    elif name == "fairlane.toml":
        write_toml(project, f"[worker]\nconcurrency = {value}\n")
    elif name == "pyproject":
        write_pyproject(project, f"[tool.fairlane.worker]\nconcurrency = {value}\n")
    elif name == "argument":
        return {"worker": {"concurrency": value}}
    return {}


PAIRS = [(high, low) for i, high in enumerate(SOURCES) for low in SOURCES[i + 1 :]]


@pytest.mark.parametrize(("high", "low"), PAIRS, ids=[f"{h}>{lo}" for h, lo in PAIRS])
def test_precedence_of_every_source_pair(tmp_path: Path, high: str, low: str) -> None:
    environ: dict[str, str] = {}
    overrides = apply_source(low, tmp_path, environ)
    overrides |= apply_source(high, tmp_path, environ)
    settings = load_settings(project_dir=tmp_path, environ=environ, **overrides)
    assert settings.worker.concurrency == VALUES[high]


def test_sources_merge_per_leaf(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "[tool.fairlane.lease]\nduration = 60\nsweep_batch = 7\n")
    write_toml(tmp_path, "[lease]\nduration = 50\n")
    environ = {"FAIRLANE_LEASE__RENEW_INTERVAL": "20"}
    settings = load_settings(project_dir=tmp_path, environ=environ, redis_url="redis://x")
    assert settings.lease.duration == 50.0
    assert settings.lease.renew_interval == 20.0
    assert settings.lease.sweep_batch == 7
    assert settings.lease.sweep_interval == 5.0
    assert settings.redis_url == "redis://x"


def test_nested_env(tmp_path: Path) -> None:
    environ = {
        "FAIRLANE_LEASE__DURATION": "20",
        "FAIRLANE_WORKER__HEALTH_PORT": "8089",
        "FAIRLANE_SERVER__STATE_DIR": "/var/lib/fairlane",
        "FAIRLANE_REDIS_URL": "redis://localhost:6379/1",
        "UNRELATED": "x",
    }
    settings = load_settings(project_dir=tmp_path, environ=environ)
    assert settings.lease.duration == 20.0
    assert settings.worker.health_port == 8089
    assert settings.server.state_dir == Path("/var/lib/fairlane")
    assert settings.redis_url == "redis://localhost:6379/1"


def test_env_names_are_case_insensitive(tmp_path: Path) -> None:
    settings = load_settings(project_dir=tmp_path, environ={"fairlane_lease__duration": "25"})
    assert settings.lease.duration == 25.0


def test_env_json_for_a_whole_section(tmp_path: Path) -> None:
    environ = {
        "FAIRLANE_LEASE": '{"duration": 40, "sweep_batch": 9}',
        "FAIRLANE_LEASE__SWEEP_BATCH": "11",
    }
    settings = load_settings(project_dir=tmp_path, environ=environ)
    assert settings.lease.duration == 40.0
    assert settings.lease.sweep_batch == 11  # the more specific variable wins


@pytest.mark.parametrize(
    ("raw", "lanes"),
    [
        ("light,heavy", ["light", "heavy"]),
        (" light , heavy ,", ["light", "heavy"]),
        ("solo", ["solo"]),
        ('["a", "b"]', ["a", "b"]),
    ],
)
def test_comma_separated_lanes_from_env(tmp_path: Path, raw: str, lanes: list[str]) -> None:
    settings = load_settings(project_dir=tmp_path, environ={"FAIRLANE_WORKER__LANES": raw})
    assert settings.worker.lanes == lanes


def test_lanes_from_files_and_arguments(tmp_path: Path) -> None:
    write_toml(tmp_path, "[worker]\nlanes = ['x', 'y']\n")
    assert load_settings(project_dir=tmp_path, environ={}).worker.lanes == ["x", "y"]
    settings = load_settings(project_dir=tmp_path, environ={}, worker={"lanes": "p,q"})
    assert settings.worker.lanes == ["p", "q"]


def test_empty_lanes_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"worker\.lanes"):
        load_settings(project_dir=tmp_path, environ={"FAIRLANE_WORKER__LANES": " , "})


def test_argument_may_be_a_model(tmp_path: Path) -> None:
    environ = {"FAIRLANE_LEASE__SWEEP_BATCH": "3"}
    lease = LeaseSettings(duration=90, renew_interval=30)
    rows = origins(tmp_path, environ, lease=lease)
    assert load_settings(project_dir=tmp_path, environ=environ, lease=lease).lease == lease
    # A whole model replaces the section, so every lease leaf is the argument's.
    assert rows["lease.sweep_batch"] == "argument"


def test_explain_reports_every_leaf_in_model_order(tmp_path: Path) -> None:
    rows = explain_settings(project_dir=tmp_path, environ={})
    assert [row.key for row in rows] == [
        "redis_url",
        "max_payload_bytes",
        "default_lane",
        "lanes_file",
        "shards",
        "lease.duration",
        "lease.renew_interval",
        "lease.sweep_interval",
        "lease.sweep_jitter",
        "lease.sweep_batch",
        "lease.heartbeat_interval",
        "lease.worker_timeout",
        "worker.concurrency",
        "worker.lanes",
        "worker.fetch_batch",
        "worker.grace_period",
        "worker.idle_block",
        "worker.health_port",
        "worker.loop_block_threshold",
        "worker.thread_pool_size",
        "worker.process_pool_size",
        "worker.deploy_window",
        "worker.handback_delay",
        "worker.pressure.enabled",
        "worker.pressure.interval",
        "worker.pressure.memory_limit",
        "worker.pressure.memory_soft",
        "worker.pressure.memory_hard",
        "worker.pressure.cpu_soft",
        "worker.pressure.psi_soft",
        "worker.pressure.psi_hard",
        "worker.pressure.min_fraction",
        "worker.pressure.recovery",
        "server.state_dir",
        "server.binary",
        "payloads.url",
        "payloads.threshold_bytes",
        "payloads.max_bytes",
        "payloads.grace",
        "payloads.recheck_interval",
        "payloads.sweep_batch",
        "connection.connect_timeout",
        "connection.timeout",
        "connection.max_connections",
        "durability.replicas",
        "durability.aof",
        "durability.timeout",
        "tenants.idle_ttl",
        "tenants.sweep_interval",
        "tenants.sweep_batch",
        "queues.tenant_max_queued",
        "queues.lane_max_queued",
        "queues.memory_high_water",
        "audit_entries",
        "front_door.tenant_max_in_flight",
        "front_door.tenant_rate",
        "front_door.tenant_burst",
        "front_door.tenants",
        "front_door.seats",
        "front_door.lag_target",
        "front_door.waiting",
        "front_door.seat_wait",
        "front_door.refusal_hold",
        "autoscale_horizon",
    ]
    assert all(row.source == "default" for row in rows)
    assert rows[5] == SettingOrigin("lease.duration", 30.0, "default")


def test_explain_reports_each_source(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "[tool.fairlane]\ndefault_lane = 'pp'\nmax_payload_bytes = 10\n")
    write_toml(tmp_path, "max_payload_bytes = 20\n[server]\nbinary = 'valkey-server'\n")
    environ = {
        "FAIRLANE_LEASE__DURATION": "20",
        "FAIRLANE_WORKER__LANES": "light,heavy",
        "FAIRLANE_SERVER__BINARY": "/opt/valkey",
    }
    rows = explain_settings(
        project_dir=tmp_path, environ=environ, worker={"concurrency": 4}, redis_url=None
    )
    by_key = {row.key: row for row in rows}
    assert by_key["default_lane"] == SettingOrigin("default_lane", "pp", PYPROJECT_LABEL)
    assert by_key["max_payload_bytes"] == SettingOrigin("max_payload_bytes", 20, "fairlane.toml")
    assert by_key["lease.duration"] == SettingOrigin(
        "lease.duration", 20.0, "env FAIRLANE_LEASE__DURATION"
    )
    assert by_key["worker.lanes"].value == ["light", "heavy"]
    assert by_key["worker.lanes"].source == "env FAIRLANE_WORKER__LANES"
    assert by_key["server.binary"] == SettingOrigin(
        "server.binary", "/opt/valkey", "env FAIRLANE_SERVER__BINARY"
    )
    assert by_key["worker.concurrency"] == SettingOrigin("worker.concurrency", 4, "argument")
    # An explicit None is still an explicit argument.
    assert by_key["redis_url"] == SettingOrigin("redis_url", None, "argument")
    assert by_key["lease.renew_interval"].source == "default"


def test_explain_names_the_actual_env_variable(tmp_path: Path) -> None:
    environ = {"fairlane_lease__duration": "20", "FAIRLANE_WORKER": '{"concurrency": 3}'}
    rows = origins(tmp_path, environ)
    assert rows["lease.duration"] == "env fairlane_lease__duration"
    assert rows["worker.concurrency"] == "env FAIRLANE_WORKER"
    assert rows["worker.fetch_batch"] == "default"


def test_explain_agrees_with_precedence(tmp_path: Path) -> None:
    for name in ("pyproject", "fairlane.toml", "env", "argument"):
        environ: dict[str, str] = {}
        overrides = apply_source(name, tmp_path, environ)
        label = {"env": "env FAIRLANE_WORKER__CONCURRENCY", "pyproject": PYPROJECT_LABEL}
        assert origins(tmp_path, environ, **overrides)["worker.concurrency"] == label.get(
            name, name
        )


def test_renew_interval_must_be_below_duration(tmp_path: Path) -> None:
    write_toml(tmp_path, "[lease]\nduration = 10\n")
    environ = {"FAIRLANE_LEASE__RENEW_INTERVAL": "10"}
    with pytest.raises(ConfigError, match=r"renew_interval .* must be less than duration") as info:
        load_settings(project_dir=tmp_path, environ=environ)
    assert "env FAIRLANE_LEASE__RENEW_INTERVAL" in str(info.value)
    assert "fairlane.toml" in str(info.value)
    with pytest.raises(ConfigError, match="renew_interval"):
        load_settings(project_dir=tmp_path, environ={}, lease={"renew_interval": 45})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_unknown_key_in_fairlane_toml(tmp_path: Path) -> None:
    write_toml(tmp_path, "redis_ulr = 'redis://x'\n")
    with pytest.raises(ConfigError, match=r"redis_ulr: Extra inputs are not permitted") as info:
        load_settings(project_dir=tmp_path, environ={})
    assert "(from fairlane.toml)" in str(info.value)


def test_unknown_nested_key_in_fairlane_toml(tmp_path: Path) -> None:
    write_toml(tmp_path, "[worker]\nconcurency = 5\n")
    with pytest.raises(ConfigError, match=r"worker\.concurency: Extra inputs"):
        load_settings(project_dir=tmp_path, environ={})


def test_unknown_key_in_pyproject(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "[tool.fairlane.lease]\nduraton = 5\n")
    with pytest.raises(ConfigError, match=r"lease\.duraton") as info:
        load_settings(project_dir=tmp_path, environ={})
    assert PYPROJECT_LABEL in str(info.value)


def test_pyproject_without_fairlane_table_is_ignored(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "[tool.ruff]\nline-length = 100\n")
    assert load_settings(project_dir=tmp_path, environ={}) == load_settings(
        project_dir=tmp_path / "missing", environ={}
    )


def test_pyproject_fairlane_must_be_a_table(tmp_path: Path) -> None:
    write_pyproject(tmp_path, "[tool]\nfairlane = 5\n")
    with pytest.raises(ConfigError, match=r"\[tool\.fairlane\] .* must be a table"):
        load_settings(project_dir=tmp_path, environ={})


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    write_toml(tmp_path, "lease = \n")
    with pytest.raises(ConfigError, match=r"invalid TOML in .*fairlane\.toml"):
        load_settings(project_dir=tmp_path, environ={})


def test_bad_type_in_env(tmp_path: Path) -> None:
    environ = {"FAIRLANE_WORKER__CONCURRENCY": "many"}
    with pytest.raises(ConfigError, match=r"worker\.concurrency: .*valid integer") as info:
        load_settings(project_dir=tmp_path, environ=environ)
    assert "got 'many'" in str(info.value)
    assert "env FAIRLANE_WORKER__CONCURRENCY" in str(info.value)


def test_bad_json_in_env(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lease"):
        load_settings(project_dir=tmp_path, environ={"FAIRLANE_LEASE": "{not json"})


def test_unknown_nested_env_var(tmp_path: Path) -> None:
    environ = {"FAIRLANE_LEASE__DURATON": "5"}
    with pytest.raises(ConfigError, match=r"lease\.duraton: Extra inputs") as info:
        load_settings(project_dir=tmp_path, environ=environ)
    assert "env FAIRLANE_LEASE__DURATON" in str(info.value)


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("FAIRLANE_LEASE_DURATION", "FAIRLANE_LEASE__DURATION"),
        ("FAIRLANE_CONCURRENCY", "FAIRLANE_WORKER__CONCURRENCY"),
        ("FAIRLANE_REDIS_ULR", "FAIRLANE_REDIS_URL"),
    ],
)
def test_misspelt_env_var_suggests_the_setting(tmp_path: Path, name: str, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} is not a Fairlane setting; did you mean"):
        load_settings(project_dir=tmp_path, environ={name: "1"})
    with pytest.raises(ConfigError, match=suggestion):
        load_settings(project_dir=tmp_path, environ={name: "1"})


def test_unknown_env_section_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FAIRLANE_QUEUE__SIZE is not a Fairlane setting"):
        load_settings(project_dir=tmp_path, environ={"FAIRLANE_QUEUE__SIZE": "1"})


def test_unrelated_fairlane_env_var_is_ignored(tmp_path: Path) -> None:
    settings = load_settings(project_dir=tmp_path, environ={"FAIRLANE_HOME": "/srv"})
    assert settings == load_settings(project_dir=tmp_path, environ={})


def test_unknown_argument(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"bogus: Extra inputs .*\(from argument\)"):
        load_settings(project_dir=tmp_path, environ={}, bogus=1)


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"worker": {"concurrency": 0}}, r"worker\.concurrency"),
        ({"worker": {"fetch_batch": 0}}, r"worker\.fetch_batch"),
        ({"lease": {"sweep_jitter": 1.5}}, r"lease\.sweep_jitter"),
        ({"lease": {"duration": 0}}, r"lease\.duration"),
        ({"worker": {"health_port": 70000}}, r"worker\.health_port"),
        ({"worker": {"process_pool_size": -1}}, r"worker\.process_pool_size"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
    ],
)
def test_out_of_range_values(tmp_path: Path, overrides: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        load_settings(project_dir=tmp_path, environ={}, **overrides)


def test_settings_class_alone_reads_cwd_and_process_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_toml(tmp_path, "[worker]\nfetch_batch = 12\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAIRLANE_WORKER__IDLE_BLOCK", "1.5")
    settings = Settings()
    assert settings.worker.fetch_batch == 12
    assert settings.worker.idle_block == 1.5
