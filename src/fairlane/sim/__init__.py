"""``fairlane simulate``: the policy core on a virtual clock, to compare policies offline.

A discrete-event simulator of one Fairlane deployment -- lanes of worker slots, service
classes, an optional admission gate, tenants with arrival processes and job sizes --
that runs the pure policy core (``fairlane.policy``) without Redis, asyncio or a wall
clock, and compares policies (``fair`` against a plain ``fifo``, or variants such as two
slice sizes) on exactly the same arrivals.

Modules, each owning one thing:

* ``scenario`` -- the typed scenario and its time scaling; ``parse`` -- the TOML format
  (``parsekeys`` its throttle keys, ``tables`` its typed reads);
* ``variants`` -- the policies and the ``fair+slice=0.5`` grammar;
* ``arrivals`` -- seeded arrival streams; ``world`` -- indices for the inner loop;
* ``fastpath`` -- the policy core's decisions on plain lists (tested against the core);
* ``keys`` -- throttle keys (tenant keys and shared keys; fair or FIFO waiters);
* ``rates`` -- rate keys (buckets, adaptive limits, pauses, waited on tenant-fair) and
  the upstream behind a key (its 429s and Retry-After);
* ``engine`` -- the event loop; ``lanes`` -- the queues, their throttle keys and the
  dispatch; ``calls`` -- upstream calls, pushbacks and retries; ``gate`` -- the admission
  gate's state and retries;
* ``raw`` -- the engine's counters; ``metrics`` -- what is measured and how;
* ``runner`` -- running a comparison, the shipped scenarios (``scenarios/*.toml``);
* ``report`` -- Rich tables and JSON; ``chart`` -- SVG charts with pygal.
"""

from __future__ import annotations

from fairlane.sim.metrics import VariantResult
from fairlane.sim.parse import load_scenario, parse_scenario
from fairlane.sim.runner import Comparison, find_scenario, run, shipped
from fairlane.sim.scenario import Scenario
from fairlane.sim.variants import parse_variants

__all__ = [
    "Comparison",
    "Scenario",
    "VariantResult",
    "find_scenario",
    "load_scenario",
    "parse_scenario",
    "parse_variants",
    "run",
    "shipped",
]
