"""The default queue bounds as settings, and pools checked against the lanes an app uses.

``queues.tenant_max_queued`` and ``queues.lane_max_queued`` from their defaults, the
environment (``FAIRLANE_QUEUES__...``) and ``fairlane.toml``, "none" lifting either
where TOML and the environment have no null; ``check_pools_used`` naming the pools
that name no lane of the app and the lanes it does use. Pure: no server.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fairlane.config.pools import Pool, check_pools_used, parse_config, unused_pools
from fairlane.config.settings import ConfigError, explain_settings, load_settings
from fairlane.policy.admission import QueueBounds

POOL = """
[pools.{name}]
capacity_units = 10
[pools.{name}.classes.standard]
nominal_share = 1.0
max_queue = 200
"""


def test_the_defaults() -> None:
    queues = load_settings(environ={}).queues
    assert (queues.tenant_max_queued, queues.lane_max_queued) == (100_000, 1_000_000)
    assert queues.bounds == QueueBounds(100_000, 1_000_000)


def test_the_environment_sets_and_lifts_them() -> None:
    env = {
        "FAIRLANE_QUEUES__TENANT_MAX_QUEUED": "50",
        "FAIRLANE_QUEUES__LANE_MAX_QUEUED": "none",
    }
    queues = load_settings(environ=env).queues
    assert queues.bounds == QueueBounds(50, None)
    rows = {row.key: row for row in explain_settings(environ=env)}
    assert rows["queues.tenant_max_queued"].value == 50
    assert rows["queues.lane_max_queued"].value is None
    assert "FAIRLANE_QUEUES__LANE_MAX_QUEUED" in rows["queues.lane_max_queued"].source


def test_a_config_file_sets_and_lifts_them(tmp_path: Path) -> None:
    (tmp_path / "fairlane.toml").write_text(
        '[queues]\ntenant_max_queued = "None"\nlane_max_queued = 2000\n'
    )
    queues = load_settings(project_dir=tmp_path, environ={}).queues
    assert queues.bounds == QueueBounds(None, 2000)


def test_keyword_arguments_may_give_none() -> None:
    queues = load_settings(environ={}, queues={"tenant_max_queued": None}).queues
    assert queues.bounds == QueueBounds(None, 1_000_000)


@pytest.mark.parametrize("bad", ["0", "-3", "lots"])
def test_a_bound_below_one_or_not_a_number_is_refused_with_its_source(bad: str) -> None:
    with pytest.raises(ConfigError, match="FAIRLANE_QUEUES__TENANT_MAX_QUEUED"):
        load_settings(environ={"FAIRLANE_QUEUES__TENANT_MAX_QUEUED": bad})


def test_a_misspelt_field_is_refused() -> None:
    with pytest.raises(ConfigError):
        load_settings(environ={}, queues={"tenant_max": 5})


def test_pools_naming_no_lane_of_the_app_are_named_with_the_lanes_it_uses() -> None:
    config = parse_config(
        {
            "pools": {
                "agent-shared": _pool(),
                "light": _pool(),
            }
        }
    )
    assert isinstance(config.pools["light"], Pool)
    assert unused_pools(config, ["default", "light"]) == ["agent-shared"]
    with pytest.raises(ConfigError) as caught:
        check_pools_used(config, ["light", "default"])
    message = str(caught.value)
    assert "'agent-shared'" in message
    assert "'default', 'light'" in message
    check_pools_used(config, ["agent-shared", "light"])  # every pool names a lane in use


def _pool() -> dict[str, object]:
    data = tomllib.loads(POOL.format(name="x"))
    pool: dict[str, object] = data["pools"]["x"]
    return pool
