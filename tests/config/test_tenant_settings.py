"""The ``tenants`` section of the settings (``fairlane.config.tenants``): its defaults, the
durations it reads from the environment and files, and what it refuses. Pure: no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairlane.config.settings import ConfigError, load_settings
from fairlane.policy.tenantstate import DEFAULT_IDLE_TTL


def test_idle_tenants_are_kept_a_week_by_default(tmp_path: Path) -> None:
    tenants = load_settings(project_dir=tmp_path, environ={}).tenants
    assert tenants.idle_ttl == DEFAULT_IDLE_TTL == 7 * 86400
    assert tenants.sweep_interval == 60
    assert tenants.sweep_batch == 500


@pytest.mark.parametrize(
    ("value", "seconds"), [("7d", 604800.0), ("12h", 43200.0), ("90s", 90.0), ("300", 300.0)]
)
def test_the_environment_gives_the_ttl_with_its_unit(
    tmp_path: Path, value: str, seconds: float
) -> None:
    environ = {"FAIRLANE_TENANTS__IDLE_TTL": value, "FAIRLANE_TENANTS__SWEEP_INTERVAL": "2m"}
    tenants = load_settings(project_dir=tmp_path, environ=environ).tenants
    assert tenants.idle_ttl == seconds
    assert tenants.sweep_interval == 120


def test_a_file_gives_them_too(tmp_path: Path) -> None:
    (tmp_path / "fairlane.toml").write_text('[tenants]\nidle_ttl = "3d"\nsweep_batch = 50\n')
    tenants = load_settings(project_dir=tmp_path, environ={}).tenants
    assert (tenants.idle_ttl, tenants.sweep_batch) == (3 * 86400, 50)


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"FAIRLANE_TENANTS__IDLE_TTL": "soon"}, "tenants.idle_ttl"),
        ({"FAIRLANE_TENANTS__IDLE_TTL": "0"}, "tenants.idle_ttl"),
        ({"FAIRLANE_TENANTS__SWEEP_BATCH": "0"}, "tenants.sweep_batch"),
        ({"FAIRLANE_TENANTS__IDEL_TTL": "1d"}, "tenants"),
    ],
)
def test_bad_values_are_refused_by_name(tmp_path: Path, environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(project_dir=tmp_path, environ=environ)
