"""The dashboard's session cookie and CSRF token, as pure functions."""

from __future__ import annotations

import pytest

from fairlane.gateway.ui.auth import (
    UiSettings,
    csrf_token,
    new_session,
    session_secret,
    verify_session,
)

SECRET = session_secret("admin-" + "k" * 32)


def test_a_session_verifies_until_it_expires() -> None:
    cookie = new_session(SECRET, 60, now=1000.0)
    nonce = verify_session(SECRET, cookie, now=1059.0)
    assert nonce is not None and cookie.split(".")[1] == nonce
    assert verify_session(SECRET, cookie, now=1061.0) is None


def test_a_changed_cookie_or_another_key_is_refused() -> None:
    cookie = new_session(SECRET, 60, now=1000.0)
    expiry, nonce, sig = cookie.split(".")
    assert verify_session(SECRET, f"{int(expiry) + 999}.{nonce}.{sig}", now=1000.0) is None
    assert verify_session(SECRET, f"{expiry}.other.{sig}", now=1000.0) is None
    assert verify_session(session_secret("another-key-" + "k" * 20), cookie, now=1000.0) is None
    for junk in ("", "a.b", "x.y.z", "1.2.3.4"):
        assert verify_session(SECRET, junk) is None


def test_csrf_tokens_are_per_session() -> None:
    assert csrf_token(SECRET, "n1") != csrf_token(SECRET, "n2")
    assert csrf_token(SECRET, "n1") == csrf_token(SECRET, "n1")


def test_settings_check_their_input() -> None:
    assert not UiSettings(read_only=True).allows("cancel")
    assert UiSettings(actions=frozenset({"cancel"})).allows("cancel")
    assert not UiSettings(actions=frozenset({"cancel"})).allows("redrive")
    with pytest.raises(ValueError, match="unknown dashboard actions"):
        UiSettings(actions=frozenset({"purge"}))
    with pytest.raises(ValueError, match="60 seconds"):
        UiSettings(session_seconds=5)
