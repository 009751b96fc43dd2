"""Scenario files: what they read as, and errors that name the file and the key.

Every shipped scenario must load; a broken file must fail with ``ConfigError`` whose
message starts with the file's path and names the key path (``tenants[1].size.mean``),
including errors raised by the reused parsers of ``fairlane.config.pools`` and
``fairlane.config.lanes``. Variants parse by the grammar documented in
``fairlane.sim.variants``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fairlane.config.settings import ConfigError
from fairlane.sim import find_scenario, load_scenario, parse_scenario, parse_variants, shipped
from fairlane.sim.runner import SCENARIO_DIR
from fairlane.sim.variants import parse_variant, resolve

SHIPPED = {
    "noisy-neighbor", "long-jobs", "changing-demand", "batch-idle", "pressure",
    "overload", "million", "weighted-shares", "shared-key", "upstream-429",
}  # fmt: skip

GOOD = """
seed = 3
[lanes.gpu]
slots = 4
[[tenants]]
name = "a"
rate = 1.0
stop = 10
"""


def test_every_shipped_scenario_loads() -> None:
    names = {name for name, _ in shipped()}
    assert names == SHIPPED
    for name in names:
        scenario = find_scenario(name)
        assert scenario.name == name
        assert scenario.description
        for text in scenario.compare:
            resolve(parse_variant(text), scenario)


def test_a_full_scenario_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("""
name = "full"
seed = 9
[sim]
slice = 0.5
charge = "jobs"
window = [10, 50]
until = 100
[compare]
variants = ["fair", "fifo+slice=inf"]
[lanes.gpu]
slots = 8
[pools.gpu]
capacity_units = 8
[pools.gpu.classes.guaranteed]
nominal_share = 0.5
response_when_full = "defer"
[pools.gpu.classes.standard]
nominal_share = 0.5
[[tenants]]
name = "t{i:03d}"
count = 12
group = "many"
class = "guaranteed"
weight = 2.5
rate = 0.5
stop = inf
diurnal = { amplitude = 0.5, period = 60 }
bursts = [[5, 10, 1], [20, 3]]
size = { dist = "pareto", mean = 2.0, alpha = 1.5 }
limits = { floor = 2, burst_pct = 0.5 }
units = 2.0
retries = 3
keys = ["model:big", "db:main"]
[[keys]]
name = "model:big"
limit = 4
[[keys]]
name = "db:main"
limit = 1
[[phases]]
name = "all"
start = 0
end = 100
""")
    s = load_scenario(path)
    assert (s.name, s.seed, s.sim.slice, s.sim.charge, s.sim.window) == (
        "full", 9, 0.5, "jobs", (10.0, 50.0),
    )  # fmt: skip
    assert s.compare == ("fair", "fifo+slice=inf")
    lane = s.lane("gpu")
    assert lane.slots == 8 and lane.pool is not None and lane.table.names == (
        "guaranteed", "standard",
    )  # fmt: skip
    (t,) = s.tenants
    assert t.names()[:2] == ["t000", "t001"] and t.count == 12 and t.group == "many"
    assert (t.service_class, t.weight, t.rate, t.stop) == ("guaranteed", 2.5, 0.5, math.inf)
    assert t.diurnal is not None and t.diurnal.period == 60
    assert [(b.at, b.count, b.over) for b in t.bursts] == [(5, 10, 1), (20, 3, 0)]
    assert (t.size.kind, t.size.mean, t.size.alpha) == ("pareto", 2.0, 1.5)
    assert t.limits is not None and t.limits.floor == 2
    assert (t.units, t.retries) == (2.0, 3)
    assert t.keys == ("model:big", "db:main")
    assert [(k.name, k.limit) for k in s.keys] == [("model:big", 4), ("db:main", 1)]
    assert s.phases[0].name == "all"


def test_lane_classes_are_read_by_the_lanes_parser(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    with_class = GOOD.replace('name = "a"', 'name = "a"\nclass = "bulk"')
    path.write_text(
        with_class
        + """
[[lanes.gpu.classes]]
name = "interactive"
nominal_share = 0.7
[[lanes.gpu.classes]]
name = "bulk"
batch = true
"""
    )
    s = load_scenario(path)
    assert s.lane("gpu").table.names == ("interactive", "bulk")
    assert s.tenants[0].service_class == "bulk"


BROKEN: list[tuple[str, str, str]] = [
    ("[lanes.gpu]\nslots = 4\n", "tenants", "at least one"),
    (GOOD.replace("slots = 4", "slots = 0"), "lanes.gpu.slots", "integer"),
    (GOOD.replace("slots = 4", "slot = 4"), "lanes.gpu.slot", "did you mean 'slots'"),
    (GOOD + "[sim]\nslice = -1\n", "sim.slice", "> 0"),
    (GOOD + "[sim]\ncharge = 'cost'\n", "sim.charge", "time, jobs, units"),
    (GOOD + "[sim]\nwindow = [5, 1]\n", "sim.window", "start < end"),
    (GOOD + "[compare]\nvariants = ['fair+slice=0']\n", "compare.variants[0]", "slice"),
    (GOOD + "[compare]\nvariants = ['lifo']\n", "compare.variants[0]", "not a policy"),
    (GOOD.replace('name = "a"', 'name = "a"\nsize = { dist = "gamma", mean = 1 }'),
     "tenants[0].size.dist", "fixed, exponential, lognormal, pareto"),
    (GOOD.replace('name = "a"', 'name = "a"\nsize = { dist = "lognormal", mean = -1 }'),
     "tenants[0].size.mean", "> 0"),
    (GOOD.replace('name = "a"', 'name = "a"\nsize = { dist = "pareto", mean = 1, alpha = 1 }'),
     "tenants[0].size.alpha", "> 1"),
    (GOOD.replace('name = "a"', 'name = "a"\nsize = { dist = "fixed", mean = 1, sigma = 1 }'),
     "tenants[0].size.sigma", "does not apply"),
    (GOOD.replace('name = "a"', 'name = "a"\nclass = "gold"'), "tenants[0].class",
     "no class 'gold'"),
    (GOOD.replace('name = "a"', 'name = "a"\nlane = "cpu"'), "tenants[0].lane", "no lane 'cpu'"),
    (GOOD.replace('name = "a"', 'name = "a"\ncount = 3'), "tenants[0].name", "pattern"),
    (GOOD.replace('name = "a"', 'name = "a"\nbursts = [[1, 2.5, 0]]'), "tenants[0].bursts[0]",
     "[at, count, over]"),
    (GOOD.replace('name = "a"', 'name = "a"\nslots = 9'), "tenants[0].slots", "wider"),
    (GOOD.replace('name = "a"', 'name = "a"\nstart = 20'), "tenants[0].stop",
     "not be before start"),
    (GOOD.replace('name = "a"', 'name = "a"\ndiurnal = { amplitude = 2 }'),
     "tenants[0].diurnal.amplitude", "[0, 1]"),
    (GOOD.replace('name = "a"', 'name = "a"\nlimits = { floor = 3, max_concurrency = 2 }'),
     "tenants[0].limits", "below the floor"),
    (GOOD.replace('name = "a"', 'name = "a"\nweight = 0'), "tenants[0].weight", "> 0"),
    (GOOD.replace('name = "a"', 'name = "a"\nrat = 1'), "tenants[0].rat", "did you mean 'rate'"),
    (GOOD + '[[tenants]]\nname = "a"\nrate = 1\n', "tenants[1].name", "named twice"),
    (GOOD + '[[tenants]]\nname = "b"\ngroup = "a"\nclass = "batch"\n',
     "tenants[1].group", "share one lane and class"),
    (GOOD + "[[phases]]\nname = 'p'\nstart = 5\nend = 5\n", "phases[0].end", "after start"),
    (GOOD.replace("stop = 10", ""), "tenants[0].stop", "needs a stop"),
    (GOOD + "[pools.cpu]\ncapacity_units = 4\n[pools.cpu.classes.standard]\n",
     "pools.cpu", "no lane 'cpu'"),
    # errors found by fairlane.config.pools and fairlane.config.lanes keep the same form
    (GOOD + "[pools.gpu]\ncapacity_units = 4\n[pools.gpu.classes.standard]\nmax_queue = -1\n",
     "pools.gpu.classes.standard.max_queue", "int"),
    (GOOD + "[[lanes.gpu.classes]]\nname = 'standard'\nnominal_share = 2\n",
     "lanes.gpu.classes[0]", "nominal_share"),
    # shared throttle keys
    (GOOD.replace('name = "a"', 'name = "a"\nkeys = ["model:big"]'), "tenants[0].keys[0]",
     "no [[keys]] entry named 'model:big'"),
    (GOOD + '[[keys]]\nname = "m"\nlimit = 0\n', "keys[0].limit", "within [1,"),
    (GOOD + '[[keys]]\nname = "m"\n', "keys[0].limit", "is required"),
    (GOOD + '[[keys]]\nname = "m"\nlimit = 1\n[[keys]]\nname = "m"\nlimit = 2\n',
     "keys[1].name", "declared twice"),
    (GOOD + '[[keys]]\nname = "tenant:a"\nlimit = 1\n', "keys[0].name", "own key"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "problem"), BROKEN)
def test_errors_name_the_file_and_the_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    assert key in message, message
    assert problem in message, message


def test_invalid_toml_and_missing_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[lanes\n")
    with pytest.raises(ConfigError, match=r"invalid TOML in .*bad\.toml"):
        load_scenario(path)
    with pytest.raises(ConfigError, match="cannot read scenario file"):
        load_scenario(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"no scenario 'nope'.*noisy-neighbor"):
        find_scenario("nope")


def test_find_scenario_by_name_or_path() -> None:
    assert find_scenario("overload").source == str(SCENARIO_DIR / "overload.toml")
    assert find_scenario(str(SCENARIO_DIR / "overload.toml")).name == "overload"


def test_variant_grammar() -> None:
    a, b, c = parse_variants(["slice=0.5,slice=inf", "fifo+throttles=on"])
    assert (a.policy, a.slice, a.label) == ("fair", 0.5, "slice=0.5")
    assert b.slice == math.inf
    assert (c.policy, c.throttles) == ("fifo", True)
    full = parse_variant("fair+admission=off+classes=off+charge=jobs")
    assert (full.admission, full.classes, full.charge) == (False, False, "jobs")
    assert parse_variant("fair+waiters=fifo").waiters == "fifo"
    assert parse_variant("fair").waiters is None
    for text, problem in [
        ("fair+fifo", "not a policy"),
        ("fair+slice=0.5+slice=1", "given twice"),
        ("fair+speed=2", "unknown key"),
        ("fair+admission=maybe", "on or off"),
        ("fair+waiters=lifo", "waiters must be fair or fifo"),
        ("fair+slice=fast", "slice"),
        ("fair++", "empty"),
    ]:
        with pytest.raises(ValueError, match=problem):
            parse_variant(text)
    with pytest.raises(ValueError, match="differ"):
        parse_variants(["fair,fair"])


def test_resolving_a_variant_against_its_scenario() -> None:
    plain = parse_scenario({"lanes": {"x": {"slots": 2}}, "tenants": [{"name": "a"}]})
    fair = resolve(parse_variant("fair"), plain)
    assert (fair.admission, fair.throttles, fair.classes, fair.slice) == (
        False, True, True, math.inf,
    )  # fmt: skip
    assert fair.waiters == "fair"
    assert resolve(parse_variant("fair+waiters=fifo"), plain).waiters == "fifo"
    fifo = resolve(parse_variant("fifo"), plain)
    assert (fifo.admission, fifo.throttles, fifo.classes) == (False, False, False)
    with pytest.raises(ValueError, match="no lane has a"):
        resolve(parse_variant("fair+admission=on"), plain)
    with pytest.raises(ValueError, match="fifo has no classes"):
        resolve(parse_variant("fifo+classes=on"), plain)
    gated = find_scenario("overload")
    assert resolve(parse_variant("fair"), gated).admission
    assert not resolve(parse_variant("fifo"), gated).admission
    assert resolve(parse_variant("fifo+admission=on"), gated).admission


def test_mapping_source_names_the_source() -> None:
    data: dict[str, Any] = {"lanes": {"x": {"slots": 2}}, "tenants": [{"name": "a", "rate": -1}]}
    with pytest.raises(ConfigError, match=r"^test-source: tenants\[0\]\.rate: "):
        parse_scenario(data, source="test-source")
