"""Job records and events decoded in one place: a typed record from the hash as the
scripts write it, leniently (a damaged field reads as its default and hides nothing
else), projections that read a few fields, and events as the scripts pack them."""

from __future__ import annotations

import json

import msgspec

from fairlane.store.keys import JOB_FIELDS
from fairlane.store.records import (
    AGE,
    LISTING,
    OWNER,
    PLACEMENT,
    TIMES,
    Event,
    JobRecord,
    decode_event,
    decode_limits,
    from_hash,
    from_values,
    job_fields,
)

ERROR = json.dumps({"type": "ValueError", "message": "no", "traceback": "tb"}).encode()


def test_a_record_reads_every_field_it_names() -> None:
    raw = {
        b"task": b"t.echo",
        b"tenant": b"acme",
        b"lane": b"gpu",
        b"cls": b"batch",
        b"prio": b"3",
        b"st": b"failed",
        b"att": b"2",
        b"max": b"3",
        b"enq": b"1000",
        b"run": b"1500",
        b"start": b"2000",
        b"fin": b"2500",
        b"wk": b"w1",
        b"sl": b"4",
        b"args": b'[["x"],{}]',
        b"err": ERROR,
        b"cx": b"1",
        b"lim": msgspec.msgpack.encode([["model:big", 2]]),
        b"emu": b"1500",
        b"cu": b"1000",
        b"amu": b"900",
        b"wfr": b"1",
        b"wf": b"signal:go",
        b"qw": b'{"ten":2}',
        b"tp": b"00-abc-def-01",
    }
    record = from_hash("j1", raw)
    assert record == JobRecord(
        "j1",
        task="t.echo",
        tenant="acme",
        lane="gpu",
        service_class="batch",
        priority=3,
        status="failed",
        attempts=2,
        max_attempts=3,
        enqueued_ms=1000,
        run_ms=1500,
        started_ms=2000,
        finished_ms=2500,
        worker="w1",
        slots=4,
        args=b'[["x"],{}]',
        error=ERROR,
        cancel_requested=True,
        limits={"model:big": 2},
        kept_mu=1500,
        charged_mu=1000,
        used_mu=900,
        run_started=True,
        waiting_for="signal:go",
        queue_wait='{"ten":2}',
        trace_context="00-abc-def-01",
    )
    assert record is not None and record.failure is not None
    assert (record.failure.type, record.failure.message) == ("ValueError", "no")
    assert record.reserved_mu == 1500


def test_an_empty_hash_is_no_record_and_absent_fields_read_as_defaults() -> None:
    assert from_hash("gone", {}) is None
    record = from_hash("j", {"st": "queued", "enq": "5"})
    assert record == JobRecord(
        "j", tenant="default", lane="default", max_attempts=3, status="queued",
        enqueued_ms=5, run_ms=5,
    )  # fmt: skip
    assert (record.service_class, record.slots, record.attempts) == ("standard", 1, 0)
    assert record.failure is None
    assert record.reserved_mu is None


def test_a_damaged_field_reads_as_its_default_and_hides_nothing_else() -> None:
    record = from_hash(
        "j",
        {
            b"st": b"queued",
            b"att": b"many",
            b"max": b"\xff",
            b"sl": b"wide",
            b"enq": b"1e3",
            b"lim": b"not msgpack \xc1",
            b"tenant": b"caf\xe9",
            b"dmu": b"2500",
        },
    )
    assert record is not None
    assert (record.status, record.attempts, record.max_attempts, record.slots) == (
        "queued",
        0,
        3,
        1,
    )
    assert record.enqueued_ms == 1000  # a number written as a float reads as a whole
    assert record.limits == {}
    assert record.tenant == "caf\ufffd"
    assert record.reserved_mu == 2500  # a deferred job's reservation to be


def test_limits_keep_each_entry_that_reads() -> None:
    raw = msgspec.msgpack.encode([["a", 1], ["b", "x"], "junk", ["c", 3]])
    assert decode_limits(raw) == {"a": 1, "c": 3}
    assert decode_limits(None) == {} and decode_limits(b"") == {}


def test_projections_read_the_fields_of_their_attributes() -> None:
    # every projection also reads the status (no status: no record) and enq (an absent
    # run reads as enq)
    assert job_fields(OWNER) == ["tenant", "task", "st", "enq"]
    assert job_fields(AGE) == ["run", "enq", "st", "enq"]
    assert job_fields(PLACEMENT) == ["lane", "cls", "tenant", "sl", "st", "enq"]
    assert job_fields(TIMES) == ["st", "enq", "run", "start", "fin", "att", "st", "enq"]
    # every field a projection reads is a documented field of the record
    for projection in (OWNER, AGE, PLACEMENT, TIMES, LISTING):
        assert set(job_fields(projection)) <= set(JOB_FIELDS)
    record = from_values("j", PLACEMENT, [b"gpu", None, b"acme", b"2", b"queued", b"5"])
    assert record == JobRecord("j", lane="gpu", tenant="acme", slots=2)
    # fields left out at their defaults, the record there
    record = from_values("j", PLACEMENT, [None, None, None, None, b"queued", b"5"])
    assert record == JobRecord("j", lane="default", tenant="default")
    assert from_values("j", PLACEMENT, [None] * 6) is None
    record = from_values("j", AGE, [None, b"5", b"queued", b"5"])
    assert record is not None and record.run_ms == 5  # an absent run reads as enq


def test_events_decode_as_the_scripts_pack_them() -> None:
    raw = msgspec.msgpack.encode([12, "parked", {"key": "k"}])
    assert decode_event(raw) == Event(12, "parked", {"key": "k"})
    assert decode_event(msgspec.msgpack.encode([5, "completed", []])) == Event(5, "completed", {})
    for bad in ([], ["x", "y"], {"ms": 1}):
        try:
            decode_event(msgspec.msgpack.encode(bad))
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} decoded as an event")
