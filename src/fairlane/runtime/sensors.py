"""What a worker measures about itself: the sensor protocol and the built-in sensors.

A ``Sensor`` is anything with a ``name`` and a cheap, non-blocking ``read()`` returning
``Reading`` objects (``fairlane.policy.backpressure``). The built-in ones read memory of
the worker and its process-pool children against a limit, CPU, and the kernel's
pressure-stall information. None of them decides anything: the gauge
(``runtime/pressure.py``) samples them and applies the policy.

The memory limit is, in order: the one configured, the container's (cgroup v2
``memory.max`` or v1 ``memory.limit_in_bytes``), or the machine's RAM. Memory is the
resident set size of the worker process plus all its descendants: shared pages of
forked children count more than once, which errs on the safe side.

On Linux the sensors read procfs and ``os.times`` themselves, the numbers psutil would
give (RAM as ``MemTotal``; the machine's busy share from ``/proc/stat`` as
``psutil.cpu_percent`` counts it; the process's own CPU time over the wall time).
Importing psutil took about 20 ms, most of it making its named tuples, of a worker's
start-up of about 320 ms before its first job. Where there is no procfs they ask
psutil, imported then.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

import msgspec

from fairlane.policy.backpressure import Reading

if TYPE_CHECKING:
    import psutil

__all__ = [
    "PSI_ROOT",
    "CpuSensor",
    "MemoryLimit",
    "MemorySensor",
    "PsiSensor",
    "Reading",
    "Sensor",
    "cgroup_limit_files",
    "describe_limit",
    "detect_memory_limit",
    "parse_psi",
    "read_cgroup_limit",
]

# cgroup v1 reports "no limit" as a huge page-aligned number near 2**63
_UNLIMITED = 1 << 60
_CGROUP_ROOT = Path("/sys/fs/cgroup")
PSI_ROOT: Final = Path("/proc/pressure")
_PSI_RESOURCES = ("cpu", "memory", "io")


@runtime_checkable
class Sensor(Protocol):
    """A source of readings. ``read`` runs on the event loop: keep it cheap, never block."""

    name: str

    def read(self) -> Sequence[Reading]: ...


# -- memory ------------------------------------------------------------------------------


class MemoryLimit(msgspec.Struct, frozen=True):
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


def _ram_bytes() -> int:
    """The machine's RAM: ``MemTotal`` (Linux), else what psutil says."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil  # noqa: PLC0415 - only where procfs is missing (the module's docstring)

    return int(psutil.virtual_memory().total)


def detect_memory_limit(
    explicit: int | None = None, files: Sequence[Path] | None = None
) -> MemoryLimit:
    """The limit the worker's memory is measured against (see the module's docstring)."""
    if explicit is not None:
        return MemoryLimit(explicit, "setting")
    ram = _ram_bytes()
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
        self._pid = os.getpid() if pid is None else pid
        self._process: psutil.Process | None = None

    def used(self) -> int:
        pid = self._pid
        if _PROC_CHILDREN:
            # procfs directly: psutil's children() scans every process on the machine
            total = _rss(pid)
            for child in _descendants(pid):
                total += _rss(child)
            return total
        import psutil  # noqa: PLC0415 - only where procfs is missing (the module's docstring)

        if self._process is None:
            self._process = psutil.Process(pid)
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


def _machine_cpu() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from ``/proc/stat``, counted as
    psutil counts them: guest time is in user and nice already, and iowait is idle."""
    try:
        with open("/proc/stat", "rb") as f:
            head = f.readline().split()
        ticks = [int(t) for t in head[1:9]]
    except (OSError, ValueError):
        return None
    if len(head) < 5 or head[0] != b"cpu":
        return None
    total = sum(ticks)
    return total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


class CpuSensor:
    """CPU busy share of the machine (acts with thresholds) and of the worker's own loop."""

    name = "cpu"

    def __init__(self, *, soft: float | None = None, hard: float = 1.0) -> None:
        self.soft = soft
        self.hard = hard if soft is not None else None
        # both measure since their previous read: primed so the first read means something
        self._machine = _machine_cpu()
        self._own = (_own_cpu(), time.monotonic())
        if self._machine is None:
            import psutil  # noqa: PLC0415 - only where procfs is missing (the module's docstring)

            psutil.cpu_percent(interval=None)

    def _machine_share(self) -> float:
        if self._machine is None:
            import psutil  # noqa: PLC0415 - only where procfs is missing (the module's docstring)

            return float(psutil.cpu_percent(interval=None)) / 100
        now = _machine_cpu()
        if now is None:
            return 0.0
        busy, total = now[0] - self._machine[0], now[1] - self._machine[1]
        self._machine = now
        return min(1.0, max(0.0, busy / total)) if total > 0 else 0.0

    def _own_share(self) -> float:
        cpu, wall = _own_cpu(), time.monotonic()
        spent, elapsed = cpu - self._own[0], wall - self._own[1]
        self._own = (cpu, wall)
        return max(0.0, spent / elapsed) if elapsed > 0 else 0.0

    def read(self) -> Sequence[Reading]:
        machine = self._machine_share()
        # one event loop runs on one core: near 1.0 the loop itself is the bottleneck
        own = self._own_share()
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
        self, root: Path = PSI_ROOT, *, soft: float | None = None, hard: float = 90.0
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


def describe_limit(sensors: Sequence[Sensor]) -> MemoryLimit | None:
    """The limit of the first memory sensor, for the worker's start-up log."""
    for sensor in sensors:
        if isinstance(sensor, MemorySensor):
            return sensor.limit
    return None
