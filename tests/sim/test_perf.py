"""Performance smoke: a 50k-job slice of the ``million`` scenario runs to completion.

Not a timing assertion (machines and loads differ): the run must finish, with every
job of 10,000 tenants accounted for, under both policies. The full scenario's wall time
is measured by hand (``fairlane simulate million``) and reported with the change.
"""

from __future__ import annotations

from fairlane.sim import find_scenario, run


def test_fifty_thousand_jobs_from_ten_thousand_tenants_complete() -> None:
    scenario = find_scenario("million")
    assert scenario.tenant_count == 10_000
    assert scenario.expected_jobs() > 900_000
    result = run(scenario, ["fair", "fifo"], scale=0.05, workers=1)
    for r in result.results:
        assert 45_000 < r.submitted < 56_000
        assert r.completed == r.submitted and r.unfinished == 0
        assert sum(row.tenants for row in r.groups) == 10_000
        assert sum(row.waits.jobs for row in r.groups) == r.submitted
