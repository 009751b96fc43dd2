"""Learned costs and the charge in cost mode (``lua/admission.lua``) against the policy.

``learn_costs`` folds the milli-units a key's attempts used into its learned cost, in
batches as the exchange gathers them, and keeps ``mean`` and ``n`` in ``cost:<key>``;
``charge_mu`` is what dispatch charges a new job's tenant when tenants are charged by
cost. Run alone as a script on the real server, over random batches of samples,
windows and declarations, the stored mean and count must be exactly those of
``fairlane.policy.admission.LearnedCost`` fed the same samples in the same order, and
the charge that of ``charge_milli`` -- the admission contract's sections Learned cost
and Charge in cost mode (``docs/contracts/admission.md``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.admission import MIN_CHARGE_MILLI, LearnedCost, charge_milli
from tests.store.harness import lua_parts

_DRIVER = """
local p, key = ARGV[1], ARGV[2]
if ARGV[3] == 'learn' then
  learn_costs(p, key, cjson.decode(ARGV[4]), tonumber(ARGV[5]))
  return redis.call('HMGET', p .. 'cost:' .. key, 'mean', 'n')
end
return string.format('%.17g', charge_mu(p, tonumber(ARGV[4]), ARGV[5] == '1', key, {}))
"""

samples = st.lists(st.integers(MIN_CHARGE_MILLI, 10**7), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def lua(redis_url: str) -> Iterator[tuple[redis.Redis, Any]]:
    client = redis.Redis.from_url(redis_url)
    script = lua_parts(
        "admission.lua",
        "COST_RISE",
        "MIN_CHARGE_MU",
        "learned_mu",
        "cached_learned_mu",
        "charge_mu",
        "learn_costs",
    )
    try:
        yield client, client.register_script(script + _DRIVER)
    finally:
        client.close()


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(samples, min_size=1, max_size=5),
    window=st.integers(1, 1000),
    declared=st.one_of(st.none(), st.integers(0, 10**7)),
)
def test_lua_learns_and_charges_as_the_policy_does(
    lua: tuple[redis.Redis, Any],
    batches: list[list[int]],
    window: int,
    declared: int | None,
) -> None:
    client, run = lua
    prefix, key = f"{{fl:c_{secrets.token_hex(4)}}}:", "tenant|task|model"
    learned = LearnedCost(window)
    try:
        for batch in batches:
            mean, n = run(args=[prefix, key, "learn", json.dumps(batch), window])
            for sample in batch:
                learned.observe(sample)
            assert (float(mean), int(n)) == learned.state
        args = [prefix, key, "charge", declared or 0, int(declared is not None)]
        assert float(run(args=args)) == charge_milli(declared, learned.value)
        nothing_learned = [prefix, "", "charge", declared or 0, int(declared is not None)]
        assert float(run(args=nothing_learned)) == charge_milli(declared, None)
    finally:
        client.delete(f"{prefix}cost:{key}")
