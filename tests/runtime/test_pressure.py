"""Resource sensors and the gauge (fairlane.runtime.pressure), and a plugged-in sensor in a worker.

The built-in sensors read this machine: the test process's memory (and a child's), the
CPU, the kernel's pressure-stall files when it has them. The cgroup limit reader is
given files with real cgroup content. The last test runs a worker with a sensor of
its own, whose value the test sets through a file, and checks that the worker holds
back, says so on /health, and takes work again when the value drops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from fairlane import App
from fairlane.app.worker import Worker
from fairlane.cli.worker import _pressure_argv, _pressure_config
from fairlane.config.settings import ConfigError, load_settings
from fairlane.metrics.pressure import PressureCollector
from fairlane.policy.backpressure import Bounds
from fairlane.runtime.pressure import (
    CpuSensor,
    MemoryLimit,
    MemorySensor,
    PressureConfig,
    PressureGauge,
    PsiSensor,
    Reading,
    Sensor,
    cgroup_limit_files,
    default_sensors,
    detect_memory_limit,
    parse_psi,
    parse_size,
    read_cgroup_limit,
)
from tests.e2e.helpers import eventually, make_app

MiB = 1 << 20
PSI = Path("/proc/pressure")


# -- memory ------------------------------------------------------------------------------


def test_memory_sensor_reads_this_process_against_its_limit() -> None:
    sensor = MemorySensor(MemoryLimit(64 * 1024 * MiB, "setting"))
    readings = {r.name: r for r in sensor.read()}
    rss = psutil.Process().memory_info().rss
    used = readings["memory_bytes"].value
    assert 0.5 * rss < used < 2 * rss
    assert readings["memory"].value == pytest.approx(used / (64 * 1024 * MiB), rel=0.2)
    assert readings["memory"].stop and readings["memory"].hard == 0.9
    assert readings["memory_limit_bytes"].value == 64 * 1024 * MiB


def test_memory_sensor_counts_child_processes() -> None:
    sensor = MemorySensor(MemoryLimit(1 << 40, "setting"))
    before = sensor.used()
    # a child that really touches 80 MiB, then waits to be killed
    code = "import time; b = bytearray(b'x') * (80 << 20); print('ok', flush=True); time.sleep(60)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == b"ok"
            grown = sensor.used() - before
            assert grown > 70 * MiB, grown
        finally:
            child.kill()
    assert sensor.used() - before < 40 * MiB


def test_cgroup_limit_files_follow_proc_self_cgroup(tmp_path: Path) -> None:
    v2 = "0::/kubepods/pod1/ctr\n"
    assert cgroup_limit_files(v2, tmp_path) == [
        tmp_path / "kubepods/pod1/ctr/memory.max",
        tmp_path / "memory.max",
    ]
    v1 = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n"
    assert cgroup_limit_files(v1, tmp_path) == [
        tmp_path / "memory/docker/abc/memory.limit_in_bytes",
        tmp_path / "memory/memory.limit_in_bytes",
    ]
    # this machine's own file parses to paths of one kind or the other
    own = cgroup_limit_files(Path("/proc/self/cgroup").read_text())
    assert own and all(p.name in ("memory.max", "memory.limit_in_bytes") for p in own)


def test_the_memory_limit_comes_from_the_setting_then_the_cgroup_then_ram(tmp_path: Path) -> None:
    ram = psutil.virtual_memory().total
    v2 = tmp_path / "memory.max"
    v1 = tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")  # cgroup v2 without a limit
    v1.write_text("9223372036854771712\n")  # cgroup v1 without a limit
    missing = tmp_path / "nope" / "memory.max"
    assert detect_memory_limit(None, [missing, v2, v1]) == MemoryLimit(ram, "ram")
    v1.write_text("536870912\n")
    assert detect_memory_limit(None, [missing, v2, v1]) == MemoryLimit(512 * MiB, "cgroup")
    assert detect_memory_limit(123 * MiB, [v1]) == MemoryLimit(123 * MiB, "setting")
    v2.write_text(f"{ram * 4}\n")  # a limit above the machine's RAM cannot be reached
    assert detect_memory_limit(None, [v2]) == MemoryLimit(ram, "cgroup")
    v2.write_text("garbage\n")
    assert read_cgroup_limit(v2) is None
    # with no files given it looks at this machine's own cgroup and finds something sane
    found = detect_memory_limit()
    assert 0 < found.bytes <= ram and found.source in ("cgroup", "ram")


def test_sizes_parse_in_the_usual_units() -> None:
    assert parse_size("2147483648") == 2 << 30
    assert parse_size("512MiB") == 512 * MiB
    assert parse_size("512m") == 512 * MiB
    assert parse_size("2GB") == 2 * 10**9
    for bad in ("", "lots", "-1", "0", "5 parsecs"):
        with pytest.raises(ValueError):
            parse_size(bad)


# -- cpu and psi -------------------------------------------------------------------------


def test_cpu_sensor_sees_this_process_working() -> None:
    sensor = CpuSensor(soft=0.9)
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    readings = {r.name: r for r in sensor.read()}
    assert 0.0 <= readings["cpu"].value <= 1.0
    assert readings["cpu"].soft == 0.9 and readings["cpu"].hard == 1.0
    assert readings["cpu_worker"].value > 0.2  # most of one core for the last 0.3 s
    assert not readings["cpu_worker"].acts


@pytest.mark.skipif(not PSI.is_dir(), reason="this kernel has no /proc/pressure")
def test_psi_files_of_this_kernel_parse() -> None:
    for resource in ("cpu", "memory", "io"):
        path = PSI / resource
        if not os.access(path, os.R_OK):
            continue
        values = parse_psi(path.read_text())
        assert "some" in values and all(0.0 <= v <= 100.0 for v in values.values()), values
    readings = PsiSensor(soft=40.0, hard=80.0).read()
    some = [r for r in readings if r.name.endswith("_some")]
    assert some and all(r.soft == 40.0 and r.hard == 80.0 and not r.stop for r in some)
    assert all(not r.acts for r in readings if r.name.endswith("_full"))


def test_psi_sensor_reads_what_it_can(tmp_path: Path) -> None:
    (tmp_path / "memory").write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
        "full avg10=2.25 avg60=0.50 avg300=0.10 total=45\n"
    )
    (tmp_path / "io").write_text("nonsense\n")
    readings = {r.name: r.value for r in PsiSensor(tmp_path).read()}
    assert readings == {"psi_memory_some": 12.5, "psi_memory_full": 2.25}
    assert parse_psi("some avg10=inf\nfull avg60=1\n") == {}


# -- the gauge ---------------------------------------------------------------------------


class _Broken:
    name = "broken"

    def read(self) -> Sequence[Reading]:
        raise OSError("sensor unplugged")


class _Fixed:
    name = "fixed"

    def __init__(self, value: float) -> None:
        self.value = value

    def read(self) -> Sequence[Reading]:
        return [Reading("fixed", self.value, 0.5, 1.0, stop=True)]


def test_gauge_skips_a_broken_sensor_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    fixed = _Fixed(0.75)
    gauge = PressureGauge([_Broken(), fixed], concurrency=8, bounds=Bounds(min_fraction=0.0))
    assert gauge.room(0) == 8  # before the first sample: every free slot
    with caplog.at_level(logging.WARNING, logger="fairlane.worker"):
        gauge.sample(0.0)
        gauge.sample(1.0)
    assert [r.getMessage() for r in caplog.records].count(
        "pressure sensor broken failed (OSError('sensor unplugged')); ignoring it"
    ) == 1
    assert gauge.target() == 4 and gauge.room(3) == 1
    fixed.value = 1.0
    gauge.sample(2.0)
    assert gauge.holding and gauge.room(0) == 0
    snap = gauge.snapshot()
    assert snap["holding"] is True and snap["stopped_by"] == ["fixed"]
    assert snap["readings"] == {"fixed": 1.0}
    families = {f.name: f for f in PressureCollector(gauge).collect()}
    assert families["fairlane_worker_pressure_target_slots"].samples[0].value == 0
    assert families["fairlane_worker_pressure_reading"].samples[0].labels == {"sensor": "fixed"}


def test_default_sensors_follow_the_config() -> None:
    config = PressureConfig(memory_limit=256 * MiB, memory_soft=0.5, memory_hard=0.7)
    sensors: list[Sensor] = default_sensors(config)
    assert all(isinstance(s, Sensor) for s in sensors)
    memory = next(s for s in sensors if isinstance(s, MemorySensor))
    assert memory.limit == MemoryLimit(256 * MiB, "setting")
    assert (memory.soft, memory.hard) == (0.5, 0.7)
    with pytest.raises(ValueError, match="memory_soft < memory_hard"):
        PressureConfig(memory_soft=0.9, memory_hard=0.8)


def test_settings_and_worker_options_make_the_config() -> None:
    settings = load_settings(
        environ={"FAIRLANE_WORKER__PRESSURE__MEMORY_LIMIT": "512MiB"},
        worker={"pressure": {"cpu_soft": 0.9}},
    )
    overrides = {"enabled": True, "memory_soft": 0.6, "memory_limit": "1g"}
    config = _pressure_config(settings, overrides)
    assert (config.memory_limit, config.memory_soft, config.cpu_soft) == (1 << 30, 0.6, 0.9)
    assert PressureConfig.from_settings(settings.worker.pressure).memory_limit == 512 * MiB
    # a supervisor's or a reloader's child gets the same options
    argv = _pressure_argv(overrides)
    assert argv == ["--backpressure", "--memory-soft", "0.6", "--memory-limit", "1g"]
    assert _pressure_argv({"enabled": False}) == ["--no-backpressure"]
    with pytest.raises(ConfigError, match="memory_soft must be below memory_hard"):
        load_settings(environ={}, worker={"pressure": {"memory_soft": 0.95}})


# -- a plugged-in sensor in a running worker ---------------------------------------------


class FileLoad:
    """A sensor of the test's own: the load is whatever number the file holds."""

    name = "file_load"

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> Sequence[Reading]:
        return [Reading("file_load", float(self.path.read_text()), soft=0.5, hard=1.0, stop=True)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _health(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
        body: dict[str, object] = json.loads(reply.read())
    return body


@pytest.mark.anyio
@pytest.mark.embedded_only
async def test_a_plugged_in_sensor_holds_the_worker_back(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    app: App = make_app(namespace, redis_url)
    ran: list[int] = []

    @app.task()
    async def note(n: int) -> int:
        ran.append(n)
        return n

    load = tmp_path / "load"
    load.write_text("0.0")
    port = _free_port()
    async with app:
        worker = Worker(
            app,
            lanes=[app.settings.default_lane],
            concurrency=4,
            health_port=port,
            sensors=[FileLoad(load)],
            pressure=PressureConfig(interval=0.05),
        )
        async with asyncio.TaskGroup() as group:
            group.create_task(worker.run())
            try:
                assert (await (await note.enqueue(0)).result(timeout=10)) == 0
                # the worker is idle now, registered for enqueues to hand it jobs
                await asyncio.sleep(0.1)
                load.write_text("1.0")

                async def holding() -> bool:
                    return worker.pressure is not None and worker.pressure.holding

                await eventually(holding, timeout=5)
                jobs = [await note.enqueue(n) for n in (1, 2, 3)]
                await asyncio.sleep(0.8)  # over ten samples, and past an idle wait
                assert ran == [0]
                assert {await job.status() for job in jobs} == {"queued"}
                health = await asyncio.to_thread(_health, port)
                assert health["ok"] is True
                assert health["pressure"] == {
                    "holding": True,
                    "fraction": 0.0,
                    "target_slots": 0,
                    "limiting": "file_load",
                    "stopped_by": ["file_load"],
                    "readings": {"file_load": 1.0},
                }
                load.write_text("0.2")
                assert [await job.result(timeout=10) for job in jobs] == [1, 2, 3]
                assert sorted(ran) == [0, 1, 2, 3]
                health = await asyncio.to_thread(_health, port)
                assert health["pressure"]["holding"] is False  # type: ignore[index]
            finally:
                worker.stop()


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no procfs here: psutil reads it")
def test_the_machines_cpu_is_counted_as_psutil_counts_it() -> None:
    # busy over total since boot, read from /proc/stat by the sensor and by psutil
    from fairlane.runtime.sensors import _machine_cpu  # noqa: PLC0415 - the twin under test

    ours = _machine_cpu()
    times = psutil.cpu_times()
    assert ours is not None
    total = sum(times) - times.guest - times.guest_nice
    theirs = (total - times.idle - times.iowait) / total
    assert ours[0] / ours[1] == pytest.approx(theirs, abs=0.002)
    assert psutil.virtual_memory().total == detect_memory_limit(None, []).bytes
