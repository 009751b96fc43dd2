"""Running a scenario: every variant on the same arrivals, and the scenario catalogue.

This module owns the entry points the command line uses: :func:`run` resolves the
variants against the scenario (the scenario's ``[compare]`` list unless others are
given), simulates each from the same seed -- so each sees exactly the same arrivals --
and summarises them; :func:`find_scenario` loads a scenario by shipped name or path.
Shipped scenarios are the TOML files in ``fairlane/sim/scenarios/``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from fairlane.config.settings import ConfigError
from fairlane.sim.engine import simulate
from fairlane.sim.metrics import VariantResult, summarize
from fairlane.sim.parse import load_scenario
from fairlane.sim.scenario import Scenario
from fairlane.sim.variants import Settings, parse_variants, resolve

__all__ = ["PARALLEL_JOBS", "SCENARIO_DIR", "Comparison", "find_scenario", "run", "shipped"]

SCENARIO_DIR = Path(__file__).parent / "scenarios"
PARALLEL_JOBS = 200_000
"""Expected jobs from which ``workers=None`` runs variants in parallel processes."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """The variants of one scenario, run on the same arrivals."""

    scenario: Scenario
    scale: float
    results: tuple[VariantResult, ...]


def shipped() -> list[tuple[str, str]]:
    """The shipped scenarios: ``(name, description)``, by name."""
    found = []
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        scenario = load_scenario(path)
        found.append((path.stem, scenario.description))
    return found


def find_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``noisy-neighbor``), or a scenario file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return load_scenario(path)
    candidate = SCENARIO_DIR / f"{name_or_path}.toml"
    if candidate.exists():
        return load_scenario(candidate)
    names = ", ".join(name for name, _ in shipped())
    raise ConfigError(f"no scenario {name_or_path!r}: not a file, nor one of {names}")


def _one(scenario: Scenario, settings: Settings) -> VariantResult:
    return summarize(simulate(scenario, settings))


def run(
    scenario: Scenario,
    variants: Sequence[str] = (),
    *,
    scale: float = 1.0,
    seed: int | None = None,
    workers: int | None = 1,
) -> Comparison:
    """Simulate each variant (default: the scenario's ``[compare]`` list) and summarise.

    ``scale`` multiplies the scenario's times and burst counts (``Scenario.scaled``);
    ``seed`` replaces its seed. ``workers`` > 1 runs variants in that many processes
    (each is independent and deterministic, so the results are the same); None picks
    one per variant and CPU when the scenario expects ``PARALLEL_JOBS`` jobs or more.
    ``ValueError`` for a malformed or impossible variant.
    """
    if seed is not None:
        scenario = replace(scenario, seed=seed)
    scenario = scenario.scaled(scale)
    chosen = parse_variants(variants or scenario.compare)
    settings = [resolve(v, scenario) for v in chosen]
    if workers is None:
        big = scenario.expected_jobs() >= PARALLEL_JOBS
        workers = min(len(settings), os.cpu_count() or 1) if big else 1
    if workers > 1 and len(settings) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(settings))) as pool:
            results = tuple(pool.map(_one, [scenario] * len(settings), settings))
    else:
        results = tuple(_one(scenario, s) for s in settings)
    return Comparison(scenario, scale, results)
