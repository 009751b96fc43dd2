"""The ``front_door`` section (``fairlane.config.frontdoor``): generous defaults, a
tenant's own bounds over them from a file or the environment, "none" to lift one, and
the gateway's own environment variables left alone. Pure: no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairlane.config.frontdoor import DoorBounds
from fairlane.config.settings import ConfigError, load_settings
from fairlane.policy.rates import Rate


def test_the_defaults_are_far_above_one_client(tmp_path: Path) -> None:
    door = load_settings(project_dir=tmp_path, environ={}).front_door
    assert door.default_bounds() == DoorBounds(100, Rate(1000.0, 1.0, 1000.0))
    assert door.bounds_of("anyone") == door.default_bounds()
    assert (door.seats, door.waiting, door.seat_wait, door.refusal_hold) == (8, 1000, 2.0, 1.0)


def test_a_tenant_overrides_what_it_names(tmp_path: Path) -> None:
    (tmp_path / "fairlane.toml").write_text(
        "[front_door]\ntenant_rate = 200\ntenant_burst = 400\n"
        "[front_door.tenants.acme]\nrate = 20\nmax_in_flight = 8\n"
        "[front_door.tenants.globex]\nburst = 5\n"
        '[front_door.tenants.batch]\nrate = "none"\nmax_in_flight = "none"\n'
        "[front_door.tenants.trickle]\nrate = 0.5\n"
    )
    door = load_settings(project_dir=tmp_path, environ={}).front_door
    # its own rate bursts to its own second's worth, not the section's 400
    assert door.bounds_of("acme") == DoorBounds(8, Rate(20.0, 1.0, 20.0))
    assert door.bounds_of("globex") == DoorBounds(100, Rate(200.0, 1.0, 5.0))
    assert door.bounds_of("batch") == DoorBounds(None, None)
    assert door.bounds_of("trickle").rate == Rate(0.5, 1.0, 1.0)  # one submit at least
    assert door.bounds_of("other") == DoorBounds(100, Rate(200.0, 1.0, 400.0))


def test_the_environment_gives_tenants_as_json(tmp_path: Path) -> None:
    environ = {
        "FAIRLANE_FRONT_DOOR__TENANT_RATE": "none",
        "FAIRLANE_FRONT_DOOR__TENANTS": '{"Acme": {"rate": 3, "burst": 6}}',
        # the gateway's own variables are not settings, and not mistaken for them
        "FAIRLANE_GATEWAY_ADMIN_KEY": "admin-" + "x" * 20,
        "FAIRLANE_GATEWAY_SERVE": "{}",
    }
    door = load_settings(project_dir=tmp_path, environ=environ).front_door
    assert door.bounds_of("Acme") == DoorBounds(100, Rate(3.0, 1.0, 6.0))
    assert door.default_bounds() == DoorBounds(100, None)


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"FAIRLANE_FRONT_DOOR__TENANT_RATE": "0"}, "front_door.tenant_rate"),
        ({"FAIRLANE_FRONT_DOOR__SEATS": "0"}, "front_door.seats"),
        ({"FAIRLANE_FRONT_DOOR__SEAT_WAIT": "0"}, "front_door.seat_wait"),
        ({"FAIRLANE_FRONT_DOOR__REFUSAL_HOLD": "-1"}, "front_door.refusal_hold"),
        ({"FAIRLANE_FRONT_DOOR__TENANTS": '{"a": {"rate": -1}}'}, "front_door.tenants"),
        ({"FAIRLANE_FRONT_DOOR__TENANTS": '{"a": {"burst": 0.5}}'}, "front_door.tenants"),
        ({"FAIRLANE_FRONT_DOOR__TENANTS": '{"a": {"rte": 1}}'}, "front_door.tenants"),
    ],
)
def test_bad_values_are_refused_by_name(tmp_path: Path, environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(project_dir=tmp_path, environ=environ)
