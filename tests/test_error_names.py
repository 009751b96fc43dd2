"""The type names a failed job records for Fairlane's own errors.

A job that fails records its error's type as ``<module>.<qualname>``
(``codec.encode_error``); ``TaskFailed.type_name``, ``explain`` and the dashboard show
it, and users match on it. These classes moved between modules without the names
changing: each keeps the module path it was recorded under before.
"""

from __future__ import annotations

import msgspec
import pytest

from fairlane import Rejected, RunNotFound, StoreUnavailable
from fairlane.app.admission import NotAcknowledged
from fairlane.codec import decode_error, encode_error
from fairlane.codec.refs import MalformedReference
from fairlane.config.files import ConfigError
from fairlane.payloads import PayloadError, PayloadMissing
from fairlane.runtime.executors import (
    ChildCrashed,
    ExecutionTimeout,
    ExecutorClosed,
    ExecutorError,
    RemoteError,
)
from fairlane.store.durability import Acknowledgement

_NOT_MET = Acknowledgement(replicas=0, local=False, wanted_replicas=1, wanted_local=False)

RECORDED: list[tuple[BaseException, str]] = [
    (ChildCrashed(-9), "fairlane.runtime.executors.ChildCrashed"),
    (ExecutionTimeout("too slow"), "fairlane.runtime.executors.ExecutionTimeout"),
    (ExecutorClosed("closed"), "fairlane.runtime.executors.ExecutorClosed"),
    (ExecutorError("failed"), "fairlane.runtime.executors.ExecutorError"),
    (RemoteError("ValueError", "bad", ""), "fairlane.runtime.executors.RemoteError"),
    (ConfigError("bad file"), "fairlane.config.ConfigError"),
    (MalformedReference("bad ref"), "fairlane.payloads.refs.MalformedReference"),
    (NotAcknowledged([], _NOT_MET), "fairlane.admission.NotAcknowledged"),
    (PayloadError("lost"), "fairlane.payloads.PayloadError"),
    (PayloadMissing("gone"), "fairlane.payloads.PayloadMissing"),
    (Rejected("over budget", 1.0), "fairlane.admission.Rejected"),
    (RunNotFound("run-1"), "fairlane.workflows.RunNotFound"),
    (StoreUnavailable("unreachable"), "fairlane.store.redis.StoreUnavailable"),
]


@pytest.mark.parametrize(
    ("error", "name"), RECORDED, ids=[type(error).__name__ for error, _ in RECORDED]
)
def test_a_failed_job_records_the_name_it_always_had(error: BaseException, name: str) -> None:
    stored = encode_error(error)
    assert msgspec.json.decode(stored)["type"] == name
    info = decode_error(stored)
    assert info.type == name
    assert info.traceback.startswith(f"{name}: ")  # the traceback explain shows names it too
