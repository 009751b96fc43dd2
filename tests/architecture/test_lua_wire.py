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
  ack      an outcome (``Outcome``), and ``ex``: the exchange's argument (``ExchangeField``)
  fetched  a fetched row (``FetchedJob``), and ``handed``: rows handed to a worker's inbox
Not counted: a script's own ``ARGV`` (``args``) and the results of HMGET (``f``, ``v``),
whose positions are the field lists beside them.
"""

from __future__ import annotations

import pytest

from fairlane.store.library import _INCLUDE, _LUA, LIBRARY_CODE, fill_constants
from fairlane.store.wire import Reply, lua_names
from tests.architecture.luasource import bare_indexes

ROWS = frozenset({"j", "c", "bounds", "rate", "ack", "ex", "fetched"})
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
