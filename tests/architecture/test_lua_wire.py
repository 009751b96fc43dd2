"""Nothing crosses the Python/Lua seam by bare position: the Lua names each place of a
wire array (``j[Job.FAIRNESS_KEY]``), each reply code and outcome kind, by the names
``fairlane.store.wire.lua_names`` gives them, and the library writes the numbers in
when it is assembled (so a name costs the server nothing, and a misspelt one fails
then).

The wire arrays, by the names the Lua gives them (a name is kept for its kind of array
throughout the library, so a bare number after it is a bare position):
  j        a submitted job (``NewJob``)
  c        a class row (``ClassField``), and ``tbl``: a class table, ``tbl[i]`` its rows
  bounds   a class's bounds in a lane's admission config (``AdmissionField``)
  rate     a job's rate key (``RateField``)
  kl       a job's key limit (``LimitField``), or a rate key where both are checked
  ack      an outcome (``Outcome``), and ``ex``: the exchange's argument (``ExchangeField``)
  fetched  a fetched row (``FetchedJob``), and ``handed``: rows handed to a worker's inbox
  leaving  ``leave``'s argument (``LeaveField``)
  args     a function's own ``ARGV`` (its ``*Arg`` in ``fairlane.store.argv``)
Not counted: the results of HMGET (``f``, ``v``), whose positions are the field lists
beside them.
"""

from __future__ import annotations

from enum import IntEnum

import msgspec
import pytest

from fairlane.policy.rates import Rate
from fairlane.store.argv import ARGV, AckArg, EnqueueArg, EnqueueAsArg, RenewArg, WfWaitArg, argv
from fairlane.store.library import _INCLUDE, _LUA, LIBRARY_CODE, fill_constants
from fairlane.store.placed import as_lists
from fairlane.store.wire import (
    ExchangeField,
    FetchedJob,
    FetchReply,
    FetchRows,
    LeaveField,
    LimitField,
    RateField,
    Reply,
    SubmittedField,
    exchange_args,
    leave_args,
    limit_entry,
    lua_names,
    parse_submitted,
    positions,
    rate_entry,
)
from tests.architecture.luasource import bare_indexes

ROWS = frozenset({"j", "c", "bounds", "rate", "kl", "ack", "ex", "fetched", "leaving", "args"})
TABLES = frozenset({"tbl", "handed"})


def _included() -> list[str]:
    return _INCLUDE.findall(_LUA.joinpath("fairlane.lua").read_text())


@pytest.mark.parametrize("name", _included())
def test_no_wire_array_is_indexed_by_a_bare_number(name: str) -> None:
    found = bare_indexes(_LUA.joinpath(name).read_text(), ROWS, TABLES)
    assert found == [], f"lua/{name} indexes wire arrays by number: {found}"


def test_the_scan_sees_bare_indexes() -> None:
    source = "local x = j[23] + tbl[i][8] + cx.tbl[x][1] + j[Job.ID] + f[2]\n"
    assert [t for _, t in bare_indexes(source, ROWS, TABLES)] == ["j..[23]", "tbl..[8]", "tbl..[1]"]


def test_names_are_written_in_and_a_misspelt_one_fails() -> None:
    assert "Job." not in LIBRARY_CODE and "Reply." not in LIBRARY_CODE
    assert (
        fill_constants("return Reply.CLASS_NOT_ENTITLED")
        == f"return {int(Reply.CLASS_NOT_ENTITLED)}"
    )
    assert fill_constants("return j[Job.FAIRNESS_KEY]") == "return j[23]"
    with pytest.raises(KeyError):
        fill_constants("return j[Job.FAIRNES_KEY]")
    assert lua_names()["Kind.THROTTLE"] == "'throttle'"


def test_a_fetched_row_is_filled_place_by_place_by_name() -> None:
    """The row a worker receives is built by FetchedJob's names, each place once (a
    positional constructor would escape the scan above)."""
    source = _LUA.joinpath("lease.lua").read_text()
    for name in positions(FetchedJob):
        assert source.count(f"[Row.{name.upper()}] =") == 1, name


def test_leave_reads_its_argument_by_name() -> None:
    source = _LUA.joinpath("worker.lua").read_text()
    for member in LeaveField:
        assert f"leaving[Leave.{member.name}]" in source, member.name


def _library_source() -> str:
    return "".join(_LUA.joinpath(name).read_text() for name in ["fairlane.lua", *_included()])


@pytest.mark.parametrize("fields", ARGV, ids=lambda fields: fields.__name__)
def test_every_argument_of_a_function_is_read_by_its_name(fields: type[IntEnum]) -> None:
    source = _library_source()
    for member in fields:
        name = f"{fields.__name__}.{member.name}"
        assert name in source, name
        assert lua_names()[name] == str(member.value)


def test_enqueue_as_hands_its_first_arguments_to_enqueue_as_they_are() -> None:
    """``enqueue_as`` calls ``enqueue`` with its own first two arguments, in place."""
    assert [(m.name, m.value) for m in EnqueueArg] == [
        (m.name, m.value) for m in EnqueueAsArg if m.value <= len(EnqueueArg)
    ]


def test_arguments_are_built_in_their_places_by_name() -> None:
    wait = argv(
        WfWaitArg,
        worker="w",
        absolute="1",
        ms=5,
        name="n",
        kind="sleep",
        seq=3,
        token="t",
        run="r",
    )
    assert len(wait) == len(WfWaitArg)
    assert wait[WfWaitArg.RUN - 1] == "r" and wait[WfWaitArg.WORKER - 1] == "w"
    assert wait[WfWaitArg.ABSOLUTE - 1] == "1" and wait[WfWaitArg.MS - 1] == 5
    with pytest.raises(TypeError, match="missing"):
        argv(EnqueueArg, lane="l")
    with pytest.raises(TypeError, match="unknown"):
        argv(EnqueueArg, lane="l", jobs=b"", worker="w")
    with pytest.raises(TypeError, match="tail"):
        argv(EnqueueArg, "extra", lane="l", jobs=b"")
    # a variadic tail starts at its FIRST_ place; an absent trailing argument is left off
    renew = argv(RenewArg, "id", "tok", worker="w", lease_ms=9)
    assert renew[RenewArg.FIRST_HELD - 1 :] == ["id", "tok"]
    assert renew[RenewArg.LEASE_MS - 1] == 9
    assert argv(AckArg, outcomes=b"o", worker=None) == [b"o"]
    assert argv(AckArg, outcomes=b"o", worker="w")[AckArg.WORKER - 1] == "w"


def test_a_limit_and_a_rate_are_placed_by_their_names() -> None:
    fixed, adaptive = limit_entry("k", 4), limit_entry("k", 8, 2)
    assert len(fixed) == LimitField.MIN - 1 and len(adaptive) == len(LimitField)
    assert fixed[LimitField.KEY - 1] == adaptive[LimitField.KEY - 1] == "k"
    assert fixed[LimitField.LIMIT - 1] == 4 and adaptive[LimitField.LIMIT - 1] == 8
    assert adaptive[LimitField.MIN - 1] == 2
    entry = rate_entry("r", Rate(20, per=2.0, burst=5, cost="units"))
    assert len(entry) == len(RateField)
    assert entry[RateField.KEY - 1] == "r" and entry[RateField.LIMIT - 1] == 20
    assert entry[RateField.PER_MS - 1] == 2000 and entry[RateField.BURST - 1] == 5
    assert entry[RateField.UNITS - 1] == 1
    # the lease checks a limit's first three places and a rate's as one shape
    assert (LimitField.KEY, LimitField.LIMIT) == (RateField.KEY, RateField.LIMIT)
    assert LimitField.MIN == RateField.PER_MS


def test_the_python_builders_place_fields_by_their_names() -> None:
    left = msgspec.msgpack.decode(leave_args(worker="w", lease_ms=30_000, lanes=["a", "b"]))
    assert len(left) == len(LeaveField)
    assert left[LeaveField.WORKER - 1] == "w"
    assert left[LeaveField.LEASE_MS - 1] == 30_000
    assert left[LeaveField.LANES - 1] == ["a", "b"]
    ex = msgspec.msgpack.decode(
        exchange_args(
            [], worker="w", want=3, lease_ms=5, promote_limit=7, lanes=["l"], idle_ms=9, slots=4
        )
    )
    assert len(ex) == len(ExchangeField)
    expected = {
        ExchangeField.OUTCOMES: [],
        ExchangeField.WORKER: "w",
        ExchangeField.WANT: 3,
        ExchangeField.LEASE_MS: 5,
        ExchangeField.PROMOTE_LIMIT: 7,
        ExchangeField.LANES: ["l"],
        ExchangeField.IDLE_MS: 9,
        ExchangeField.SLOTS: 4,
    }
    assert {f: ex[f - 1] for f in ExchangeField} == expected


def test_the_fetch_reply_and_its_fallback_share_their_places() -> None:
    assert positions(FetchRows) == positions(FetchReply)
    assert lua_names()["Fetch.JOBS"] == str(positions(FetchReply)["jobs"])


def test_the_enqueue_reply_is_read_by_its_places() -> None:
    entries = [{"ID": "a", "CODE": 1, "DETAIL": ""}, {"ID": "b", "CODE": -4, "DETAIL": "full|3"}]
    flat: list[object] = []
    for entry in entries:
        flat.extend(entry[f.name] for f in sorted(SubmittedField))
    first, second = parse_submitted(flat)
    assert (first.id, first.code, first.reason) == ("a", Reply.ACCEPTED, None)
    assert (second.id, second.code, second.reason) == ("b", Reply.REJECTED, "full")
    assert second.earlier_rejections == 3


def test_a_constructor_keyed_by_its_places_is_assembled_as_a_list() -> None:
    keyed = "return {[Fetch.NEXT_DUE_MS] = f(1, {2}), [Fetch.ACK_CODES] = 'a,}', [Fetch.JOBS] = x}"
    assert fill_constants(keyed) == "return {(f(1, {2})), ('a,}'), (x)}"
    # places out of order, a gap or a comment inside: left as written
    for kept in ("{[2] = a, [1] = b}", "{[1] = a, [3] = b}", "{[1] = a, -- why\n [2] = b}"):
        assert as_lists(kept) == kept
    assert as_lists("{[1] = a, [2] = {[1] = b}}") == "{(a), ({[1] = b})}"
    assert as_lists("{[1] = a,\n [2] = b}\nx") == "{(a), (b)}\n\nx"
    # the library holds no keyed constructor it could have listed
    assert as_lists(LIBRARY_CODE) == LIBRARY_CODE
    assert "{[1] =" not in LIBRARY_CODE
