"""Resource sensors and the gauge that turns their readings into a worker's fetch allowance.

This module owns what a worker measures about itself and how often: the ``Sensor``
protocol (anything with a ``name`` and a cheap, non-blocking ``read()`` returning
``Reading`` objects), the built-in sensors -- memory of the worker and its process-pool
children against a limit, CPU, and the kernel's pressure-stall information -- and
``PressureGauge``, which samples them at most once per ``interval`` and applies the
pure policy of ``fairlane.policy.backpressure``. The worker asks the gauge how many
slots it may lease; the gauge never talks to Redis.

The memory limit is, in order: the one configured, the container's (cgroup v2
``memory.max`` or v1 ``memory.limit_in_bytes``), or the machine's RAM. Memory is the
resident set size of the worker process plus all its descendants: shared pages of
forked children count more than once, which errs on the safe side.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairlane.config.settings import PressureSettings
from fairlane.config.units import parse_size
from fairlane.policy.backpressure import Bounds, Decision, PressureState, Reading, allowance, decide

__all__ = [
    "CpuSensor",
    "MemoryLimit",
    "MemorySensor",
    "PressureCollector",
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
]

log = logging.getLogger("fairlane.worker")

# cgroup v1 reports "no limit" as a huge page-aligned number near 2**63
_UNLIMITED = 1 << 60
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PSI_ROOT = Path("/proc/pressure")
_PSI_RESOURCES = ("cpu", "memory", "io")


@runtime_checkable
class Sensor(Protocol):
    """A source of readings. ``read`` runs on the event loop: keep it cheap, never block."""

    name: str

    def read(self) -> Sequence[Reading]: ...


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
    psi_root: Path = _PSI_ROOT

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


# -- memory ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """A memory limit in bytes and where it came from: setting, cgroup or ram."""

    bytes: int
    source: str


def read_cgroup_limit(path: Path) -> int | None:
    """The limit in a cgroup ``memory.max`` / ``memory.limit_in_bytes`` file; None if unlimited."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _UNLIMITED else None


def cgroup_limit_files(proc_cgroup: str, root: Path = _CGROUP_ROOT) -> list[Path]:
    """The files that may hold this process's memory limit, nearest first.

    ``proc_cgroup`` is the text of ``/proc/self/cgroup``. Inside a container the
    cgroup is usually mounted at its own root, so the root's files come last.
    """
    files: list[Path] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":  # v2: one unified hierarchy
            files += [root / rel / "memory.max", root / "memory.max"]
        elif "memory" in controllers.split(","):
            files += [
                root / "memory" / rel / "memory.limit_in_bytes",
                root / "memory" / "memory.limit_in_bytes",
            ]
    return list(dict.fromkeys(files))


def detect_memory_limit(
    explicit: int | None = None, files: Sequence[Path] | None = None
) -> MemoryLimit:
    """The limit the worker's memory is measured against (see the module's docstring)."""
    if explicit is not None:
        return MemoryLimit(explicit, "setting")
    ram = psutil.virtual_memory().total
    if files is None:
        try:
            files = cgroup_limit_files(Path("/proc/self/cgroup").read_text())
        except OSError:
            files = []
    for path in files:
        limit = read_cgroup_limit(path)
        if limit is not None:
            # a container limit above the machine's RAM cannot be reached
            return MemoryLimit(min(limit, ram), "cgroup")
    return MemoryLimit(ram, "ram")


_PROC_CHILDREN = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, from each thread's ``children`` file (Linux)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # exited meanwhile
            continue
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            found += kids
            stack += kids
    return found


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # exited meanwhile
        return 0


class MemorySensor:
    """Resident memory of a process and all its descendants, as a share of a limit."""

    name = "memory"

    def __init__(
        self,
        limit: MemoryLimit | None = None,
        *,
        soft: float = 0.8,
        hard: float = 0.9,
        pid: int | None = None,
    ) -> None:
        self.limit = limit or detect_memory_limit()
        self.soft, self.hard = soft, hard
        self._process = psutil.Process(pid)

    def used(self) -> int:
        pid = self._process.pid
        if _PROC_CHILDREN:
            # procfs directly: psutil's children() scans every process on the machine
            total = _rss(pid)
            for child in _descendants(pid):
                total += _rss(child)
            return total
        total = int(self._process.memory_info().rss)
        for proc in self._process.children(recursive=True):
            try:
                total += int(proc.memory_info().rss)
            except psutil.Error:  # it exited between the listing and the read
                continue
        return total

    def read(self) -> Sequence[Reading]:
        used = self.used()
        return [
            Reading("memory", used / self.limit.bytes, self.soft, self.hard, stop=True),
            Reading("memory_bytes", float(used)),
            Reading("memory_limit_bytes", float(self.limit.bytes)),
        ]


# -- cpu ---------------------------------------------------------------------------------


class CpuSensor:
    """CPU busy share of the machine (acts with thresholds) and of the worker's own loop."""

    name = "cpu"

    def __init__(self, *, soft: float | None = None, hard: float = 1.0) -> None:
        self.soft = soft
        self.hard = hard if soft is not None else None
        self._process = psutil.Process()
        # both measure since their previous call: prime them so the first read means something
        psutil.cpu_percent(interval=None)
        self._process.cpu_percent(interval=None)

    def read(self) -> Sequence[Reading]:
        machine = psutil.cpu_percent(interval=None) / 100
        # one event loop runs on one core: near 1.0 the loop itself is the bottleneck
        own = self._process.cpu_percent(interval=None) / 100
        return [Reading("cpu", machine, self.soft, self.hard), Reading("cpu_worker", own)]


# -- pressure-stall information ----------------------------------------------------------


def parse_psi(text: str) -> dict[str, float]:
    """``{"some": avg10, "full": avg10}`` from a ``/proc/pressure/*`` file (percent)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        fields = dict(part.split("=", 1) for part in rest.split() if "=" in part)
        try:
            value = float(fields["avg10"])
        except (KeyError, ValueError):
            continue
        if math.isfinite(value):
            out[kind] = value
    return out


class PsiSensor:
    """The kernel's pressure-stall averages (avg10) for cpu, memory and io, where readable."""

    name = "psi"

    def __init__(
        self, root: Path = _PSI_ROOT, *, soft: float | None = None, hard: float = 90.0
    ) -> None:
        self.root = root
        self.soft = soft
        self.hard = hard if soft is not None else None
        # files that cannot be read now (no PSI in this kernel) are not tried again
        self._files = [(r, root / r) for r in _PSI_RESOURCES if os.access(root / r, os.R_OK)]

    def read(self) -> Sequence[Reading]:
        readings: list[Reading] = []
        for resource, path in self._files:
            try:
                values = parse_psi(path.read_text())
            except OSError:
                continue
            for kind, value in sorted(values.items()):
                acts = kind == "some"
                readings.append(
                    Reading(
                        f"psi_{resource}_{kind}",
                        value,
                        self.soft if acts else None,
                        self.hard if acts else None,
                    )
                )
        return readings


def default_sensors(config: PressureConfig) -> list[Sensor]:
    """The built-in sensors, with the thresholds of ``config``."""
    limit = detect_memory_limit(config.memory_limit)
    return [
        MemorySensor(limit, soft=config.memory_soft, hard=config.memory_hard),
        CpuSensor(soft=config.cpu_soft, hard=config.cpu_hard),
        PsiSensor(config.psi_root, soft=config.psi_soft, hard=config.psi_hard),
    ]


# -- the gauge ---------------------------------------------------------------------------


@dataclass(slots=True)
class PressureGauge:
    """Samples sensors and keeps the policy's decision; the worker asks it for room."""

    sensors: Sequence[Sensor]
    concurrency: int
    bounds: Bounds = field(default_factory=Bounds)
    interval: float = 0.5
    state: PressureState = field(default_factory=PressureState)
    readings: tuple[Reading, ...] = ()
    decision: Decision | None = None
    last_sample: float | None = None
    _failing: set[str] = field(default_factory=set)

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


class PressureCollector(Collector):
    """Prometheus gauges of a worker's pressure: its allowance and every reading."""

    def __init__(self, gauge: PressureGauge) -> None:
        self.gauge = gauge

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        gauge = self.gauge
        target = GaugeMetricFamily(
            "fairlane_worker_pressure_target_slots",
            "Slots the worker may fill under resource pressure (0: it takes no new work).",
        )
        target.add_metric([], gauge.target())
        yield target
        readings = GaugeMetricFamily(
            "fairlane_worker_pressure_reading",
            "The worker's latest sensor readings (memory as a share of its limit, PSI in %).",
            labels=["sensor"],
        )
        for r in gauge.readings:
            readings.add_metric([r.name], r.value)
        yield readings


def describe_limit(sensors: Sequence[Sensor]) -> MemoryLimit | None:
    """The limit of the first memory sensor, for the worker's start-up log."""
    for sensor in sensors:
        if isinstance(sensor, MemorySensor):
            return sensor.limit
    return None
