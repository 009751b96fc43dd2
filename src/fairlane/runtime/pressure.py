"""The gauge that turns a worker's sensor readings into its fetch allowance.

This module owns how a worker holds back under resource pressure and how often it
looks: ``PressureConfig`` (the thresholds, from the ``worker.pressure`` settings),
``PressureGauge``, which samples the sensors (``runtime/sensors.py``) at most once per
``interval`` and applies the pure policy of ``fairlane.policy.backpressure``, and
``worker_gauge``, a worker's choice between given and built-in sensors. The worker asks
the gauge how many slots it may lease; the gauge never talks to Redis. Its Prometheus
gauges are the metrics floor's (``fairlane.metrics.pressure``). The sensors' names are
importable from here too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from fairlane.config.settings import PressureSettings
from fairlane.config.units import parse_size
from fairlane.policy.backpressure import Bounds, Decision, PressureState, Reading, allowance, decide
from fairlane.runtime.sensors import (
    PSI_ROOT,
    CpuSensor,
    MemoryLimit,
    MemorySensor,
    PsiSensor,
    Sensor,
    cgroup_limit_files,
    describe_limit,
    detect_memory_limit,
    parse_psi,
    read_cgroup_limit,
)

__all__ = [
    "CpuSensor",
    "MemoryLimit",
    "MemorySensor",
    "PressureConfig",
    "PressureGauge",
    "PsiSensor",
    "Reading",
    "Sensor",
    "cgroup_limit_files",
    "default_sensors",
    "describe_limit",
    "detect_memory_limit",
    "parse_psi",
    "parse_size",
    "read_cgroup_limit",
    "worker_gauge",
]

log = logging.getLogger("fairlane.worker")


@dataclass(frozen=True, slots=True)
class PressureConfig:
    """How a worker holds back under resource pressure.

    Memory acts by default: above ``memory_soft`` of the limit the worker shrinks the
    share of its slots it fills, down to ``min_fraction``; at ``memory_hard`` it takes
    nothing new until memory falls back to halfway between the two. CPU (a fraction of
    the machine, 0..1) and PSI (percent of the last 10 s that tasks stalled, the "some"
    line of each resource) are always reported, and act only when given thresholds: a
    saturated CPU is the normal state of a busy worker, and shrinking would cost
    throughput for nothing unless you say it is a problem.
    """

    enabled: bool = True
    interval: float = 0.5
    memory_limit: int | None = None  # bytes; None: the container's, else the machine's
    memory_soft: float = 0.8
    memory_hard: float = 0.9
    cpu_soft: float | None = None
    cpu_hard: float = 1.0
    psi_soft: float | None = None
    psi_hard: float = 90.0
    min_fraction: float = 0.25
    recovery: float = 0.5
    psi_root: Path = PSI_ROOT

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"interval must be above 0, got {self.interval}")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError(f"memory_limit must be above 0, got {self.memory_limit}")
        if not 0 < self.memory_soft < self.memory_hard:
            raise ValueError(
                f"need 0 < memory_soft < memory_hard, got {self.memory_soft}, {self.memory_hard}"
            )
        if self.cpu_soft is not None and not 0 <= self.cpu_soft < self.cpu_hard:
            raise ValueError(f"need 0 <= cpu_soft < cpu_hard, got {self.cpu_soft}, {self.cpu_hard}")
        if self.psi_soft is not None and not 0 <= self.psi_soft < self.psi_hard:
            raise ValueError(f"need 0 <= psi_soft < psi_hard, got {self.psi_soft}, {self.psi_hard}")
        self.bounds()  # validates min_fraction and recovery

    def bounds(self) -> Bounds:
        return Bounds(min_fraction=self.min_fraction, recovery=self.recovery)

    @classmethod
    def from_settings(cls, settings: PressureSettings, **changes: Any) -> PressureConfig:
        """The config of the ``worker.pressure`` settings, with ``changes`` on top."""
        return replace(cls(**settings.model_dump()), **changes)


def default_sensors(config: PressureConfig) -> list[Sensor]:
    """The built-in sensors, with the thresholds of ``config``."""
    limit = detect_memory_limit(config.memory_limit)
    return [
        MemorySensor(limit, soft=config.memory_soft, hard=config.memory_hard),
        CpuSensor(soft=config.cpu_soft, hard=config.cpu_hard),
        PsiSensor(config.psi_root, soft=config.psi_soft, hard=config.psi_hard),
    ]


# -- the gauge ---------------------------------------------------------------------------


class PressureGauge(msgspec.Struct):
    """Samples sensors and keeps the policy's decision; the worker asks it for room."""

    sensors: Sequence[Sensor]
    concurrency: int
    bounds: Bounds = msgspec.field(default_factory=Bounds)
    interval: float = 0.5
    state: PressureState = msgspec.field(default_factory=PressureState)
    readings: tuple[Reading, ...] = ()
    decision: Decision | None = None
    last_sample: float | None = None
    _failing: set[str] = msgspec.field(default_factory=set)

    def due(self, now: float) -> bool:
        return self.last_sample is None or now - self.last_sample >= self.interval

    def sample(self, now: float) -> Decision:
        """Read every sensor and decide; a sensor that raises is skipped (and logged once)."""
        readings: list[Reading] = []
        for sensor in self.sensors:
            name = getattr(sensor, "name", type(sensor).__name__)
            try:
                readings.extend(sensor.read())
            except Exception as exc:  # a broken sensor must not stop the worker
                if name not in self._failing:
                    self._failing.add(name)
                    log.warning("pressure sensor %s failed (%r); ignoring it", name, exc)
                continue
            self._failing.discard(name)
        self.readings = tuple(readings)
        self.decision = decide(readings, self.state, self.bounds, now)
        self.state = self.decision.state
        self.last_sample = now
        return self.decision

    def room(self, used: int) -> int:
        """Slots the worker may lease now (every free slot before the first sample)."""
        if self.decision is None:
            return max(0, self.concurrency - used)
        return allowance(self.decision, self.concurrency, used)

    @property
    def holding(self) -> bool:
        return self.decision is not None and self.decision.holding

    def target(self) -> int:
        return self.concurrency if self.decision is None else self.decision.target(self.concurrency)

    def snapshot(self) -> dict[str, object]:
        """What the worker's ``/health`` shows: the allowance and every reading."""
        d = self.decision
        return {
            "holding": self.holding,
            "fraction": None if d is None else round(d.fraction, 4),
            "target_slots": self.target(),
            "limiting": None if d is None else d.limiting,
            "stopped_by": [] if d is None else list(d.stopped),
            "readings": {r.name: round(r.value, 4) for r in self.readings},
        }


def worker_gauge(
    concurrency: int, config: PressureConfig, sensors: Sequence[Sensor] | None = None
) -> PressureGauge | None:
    """A worker's gauge: ``sensors`` if given (they replace the built-ins), else the
    built-ins; None when pressure is turned off and no sensors are given."""
    if sensors is None and not config.enabled:
        return None
    chosen = list(sensors) if sensors is not None else default_sensors(config)
    return PressureGauge(chosen, concurrency, config.bounds(), config.interval)
