"""``explain`` for jobs on rate keys: parked for tokens, woken by the key, pushed back by
the upstream (``Throttled``), and, while a job still waits, when the key's next tokens
are due and a pause with its cause.

Pure tests pin the sentences from a record, events and the keys' state as the read
model gives it; the end-to-end tests run real jobs through real workers on a real
server and read the answer as the command line and the dashboard do. Assertions are
about causes, keys and order, never about exact timings.
"""

from __future__ import annotations

from fairlane.policy.rates import Adaptive, Rate
from fairlane.store.explain import explain, rate_keys_now, rate_text
from fairlane.store.records import Event
from fairlane.store.views.rates import JobRates, RateKeyView

RATE = Rate(2, per=1.0)


def _record(**fields: bytes) -> dict[str, bytes]:
    return {"st": b"queued", "enq": b"1000", "cls": b"standard", "att": b"0", **fields}


def test_a_job_parked_on_a_rate_key_is_explained_by_the_key_and_its_rate() -> None:
    rates = JobRates({"model:x": RATE})
    done = _record(st=b"completed", att=b"1", start=b"2600", fin=b"2700", wk=b"w1")
    events = [Event(1000, "parked", {"key": "model:x"}), Event(2500, "granted", {"key": "model:x"})]
    answer = explain(done, events, rates=rates)
    parked = [s for s in answer.segments if s.what == "parked"]
    assert len(parked) == 1
    assert parked[0].why == "parked on rate key model:x (2 per 1 s, burst 2) in its tenant's group"
    assert (parked[0].cause, parked[0].about, parked[0].ms) == ("rate", ("model:x",), 1500)
    woken = [s for s in answer.segments if s.from_ms == 2500]
    assert woken[0].why.startswith("woken by rate key model:x (its tokens taken)")
    assert "rate" in answer.causes and answer.summary.endswith("; completed.")
    # without its rate keys (a record read by an earlier reader), the same key is a
    # throttle key, as before
    plain = explain(done, events)
    assert [s.cause for s in plain.segments if s.what == "parked"] == ["throttle"]


def test_a_job_still_waiting_is_told_when_the_next_tokens_are_due_and_of_a_pause() -> None:
    view = RateKeyView(
        "model:x",
        now_ms=5000,
        rate=RATE,
        tokens=0.2,
        paused_until_ms=8000,
        pause_cause="429 from job j7",
        waiters=3,
        due_ms=8000,
    )
    rates = JobRates({"model:x": RATE}, keys={"model:x": view})
    answer = explain(
        _record(), [Event(1000, "parked", {"key": "model:x"})], now_ms=5000, rates=rates
    )
    last = answer.segments[-1]
    assert last.open and last.what == "parked" and last.cause == "rate"
    assert last.why == (
        "parked on rate key model:x (2 per 1 s, burst 2) in its tenant's group; the key is "
        "paused (429 from job j7) for 3.0 s more, its next tokens are due in 3.0 s"
    )
    # not paused, short of tokens: when they are due (a units key: the job's own cost)
    units = Rate(10, per=1.0, cost="units")
    short = RateKeyView("model:u", 5000, units, tokens=1.0, waiters=1)
    rates = JobRates({"model:u": units}, units=4.0, keys={"model:u": short})
    answer = explain(
        _record(), [Event(1000, "parked", {"key": "model:u"})], now_ms=5000, rates=rates
    )
    assert answer.segments[-1].why.endswith("its next tokens are due in 300 ms")
    # a segment that ended is told nothing of the key's state now
    ended = explain(
        _record(),
        [Event(1000, "parked", {"key": "model:u"}), Event(2000, "granted", {"key": "model:u"})],
        now_ms=5000,
        rates=rates,
    )
    assert "due" not in ended.segments[1].why


def test_a_pushback_ends_the_attempt_and_pauses_the_job_until_the_pause_ends() -> None:
    rates = JobRates({"model:x": RATE}, pushbacks=1)
    done = _record(st=b"completed", att=b"1", start=b"14000", fin=b"14100", wk=b"w1")
    events = [
        Event(2000, "pushback", {"key": "model:x", "until": 14000, "start": 1500, "wk": "w1"}),
        Event(14000, "due", {}),
    ]
    answer = explain(done, events, rates=rates)
    whats = [(s.what, s.from_ms, s.to_ms) for s in answer.segments]
    assert whats == [
        ("queued", 1000, 1500),
        ("running", 1500, 2000),
        ("paused", 2000, 14000),
        ("queued", 14000, 14000),
        ("running", 14000, 14100),
    ]
    running, paused = answer.segments[1], answer.segments[2]
    assert running.why.endswith("pushed back by the upstream on key model:x (Throttled)")
    assert paused.why == (
        "key model:x (2 per 1 s, burst 2) paused for 12.0 s by the upstream's pushback, due "
        "again at the pause's end with its attempt given back"
    )
    assert (paused.cause, paused.about) == ("pushback", ("model:x",))


def test_a_jobs_rate_keys_now_in_plain_values() -> None:
    units = Rate(90_000, per=60.0, burst=10_000, cost="units")
    view = RateKeyView(
        "model:gpt",
        5000,
        units,
        tokens=-120.0,
        adaptive=12.5,
        adaptive_bounds=Adaptive(40, 1),
        waiters=1,
    )
    rates = JobRates(
        {"model:gpt": units, "user:a/1": RATE},
        {"model:gpt": Adaptive(40, 1)},
        units=6.8,
        keys={"model:gpt": view},
    )
    rows = {r["key"]: r for r in rate_keys_now(rates)}
    gpt = rows["model:gpt"]
    assert gpt["cost"] == 6.8 and gpt["tokens"] == -120.0
    assert gpt["adaptive"] == {"limit": 12, "max": 40, "min": 1}
    assert gpt["text"].startswith(
        "key model:gpt: 90,000 units per 60 s, burst 10,000; adaptive limit 12 in [1, 40]; "
        "-120.00 tokens now; its next tokens are due in"
    )
    assert rows["user:a/1"]["text"] == "key user:a/1: 2 per 1 s, burst 2"
    assert rate_text(Rate(0.5, per=0.25, burst=1.5)) == "0.5 per 0.25 s, burst 1.5"
