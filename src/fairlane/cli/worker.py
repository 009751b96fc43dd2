"""``fairlane worker``: run a worker (or supervise several), restart it on code changes, or
health-check one (those modes: ``cli/worker_modes.py``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from fairlane.cli._common import (
    EXIT_USAGE,
    AppSpec,
    RedisUrl,
    fail,
    load_app,
    locate_server,
    run,
    settings_or_fail,
)
from fairlane.cli.worker_modes import (
    child_argv,
    configure_logging,
    health_check,
    reload_on_changes,
    split_lanes,
    supervise,
)
from fairlane.config.settings import Settings
from fairlane.metrics import MetricsConfig
from fairlane.runtime.pressure import PressureConfig, detect_memory_limit, parse_size
from fairlane.store.api import redact_url

__all__ = ["worker"]

log = logging.getLogger("fairlane.cli")


def worker(
    app_spec: AppSpec,
    *,
    lanes: Annotated[
        str | None,
        typer.Option(
            "--lanes",
            metavar="LANES",
            help="Comma-separated lanes to serve, e.g. light,heavy (default: the "
            "worker.lanes setting).",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Worker slots: jobs run at once, a job declared with slots=N taking N "
            "(default: the worker.concurrency setting, 50).",
            show_default=False,
        ),
    ] = None,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once there is no work left.")
    ] = False,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Development: restart the worker when a Python file under the working "
            "directory changes (needs fairlane\\[reload]).",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Health check, not a worker: exit 0 when a worker of the app sent a "
            "heartbeat within lease.duration (and /health on --health-port answers 200), "
            "else 1.",
        ),
    ] = False,
    health_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve GET /health on 127.0.0.1:PORT (with --check: the port to probe).",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve Prometheus metrics (GET /metrics) and autoscaler JSON (GET /autoscale) "
            "on 0.0.0.0:PORT.",
            show_default=False,
        ),
    ] = None,
    metrics_tenants: Annotated[
        str | None,
        typer.Option(
            "--metrics-tenants",
            metavar="TENANTS",
            help="Comma-separated tenants that always get their own tenant label in metrics.",
            show_default=False,
        ),
    ] = None,
    metrics_top_n: Annotated[
        int,
        typer.Option(
            "--metrics-top-n",
            min=0,
            metavar="N",
            help="Besides --metrics-tenants, the N busiest tenants get their own tenant "
            "label; all others are labelled 'other'.",
        ),
    ] = 20,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            "--memory-limit",
            metavar="SIZE",
            help="Memory the worker and its child processes may use, e.g. 2GiB or 512m "
            "(default: the container's cgroup limit, else the machine's RAM; with "
            "--processes N each worker gets 1/N).",
            show_default=False,
        ),
    ] = None,
    memory_soft: Annotated[
        float | None,
        typer.Option(
            "--memory-soft",
            min=0.01,
            max=1.0,
            metavar="FRACTION",
            help="Above this share of --memory-limit the worker fills fewer of its slots "
            "(default 0.8).",
            show_default=False,
        ),
    ] = None,
    memory_hard: Annotated[
        float | None,
        typer.Option(
            "--memory-hard",
            min=0.01,
            max=1.0,
            metavar="FRACTION",
            help="At this share of --memory-limit the worker takes no new work until memory "
            "falls halfway back to --memory-soft; running jobs go on (default 0.9).",
            show_default=False,
        ),
    ] = None,
    cpu_soft: Annotated[
        float | None,
        typer.Option(
            "--cpu-soft",
            min=0.0,
            max=0.99,
            metavar="FRACTION",
            help="Fill fewer slots while the machine's CPU is busier than this (0..1), down to "
            "a quarter of them at 100% (default: off; CPU is reported either way).",
            show_default=False,
        ),
    ] = None,
    psi_soft: Annotated[
        float | None,
        typer.Option(
            "--psi-soft",
            min=0.0,
            max=100.0,
            metavar="PERCENT",
            help="Fill fewer slots while tasks stall on cpu, memory or io more than this "
            "share of the time (Linux pressure-stall avg10), down to a quarter at --psi-hard "
            "(default: off; PSI is reported either way).",
            show_default=False,
        ),
    ] = None,
    psi_hard: Annotated[
        float | None,
        typer.Option(
            "--psi-hard",
            min=0.0,
            max=100.0,
            metavar="PERCENT",
            help="(default 90)",
            show_default=False,
        ),
    ] = None,
    backpressure: Annotated[
        bool | None,
        typer.Option(
            "--backpressure/--no-backpressure",
            help="Watch memory, CPU and pressure stalls and fetch less under pressure "
            "(default: on). Every default here comes from the worker.pressure settings.",
            show_default=False,
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            min=1,
            metavar="N",
            help="Run N worker processes under a supervisor that restarts any that dies and "
            "stops them all on SIGTERM/SIGINT (default 1: this process is the worker).",
            show_default=False,
        ),
    ] = None,
    redis_url: RedisUrl = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    """Run a worker for MODULE:APP until SIGTERM/SIGINT (graceful), or with --burst until idle."""
    given = {
        "enabled": backpressure,
        "memory_limit": memory_limit,
        "memory_soft": memory_soft,
        "memory_hard": memory_hard,
        "cpu_soft": cpu_soft,
        "psi_soft": psi_soft,
        "psi_hard": psi_hard,
    }
    overrides = {key: value for key, value in given.items() if value is not None}
    # checked now, so that a bad combination is a usage error before anything starts
    pressure = _pressure_config(settings_or_fail(), overrides)
    _refuse_combinations(
        reload=reload,
        check=check,
        burst=burst,
        processes=processes,
        health_port=health_port,
        metrics_port=metrics_port,
    )
    start = _Start(
        app_spec,
        lanes=lanes,
        concurrency=concurrency,
        burst=burst,
        redis_url=redis_url,
        verbose=verbose,
        pressure_argv=_pressure_argv(overrides),
    )
    if processes is not None and processes > 1:
        start.supervise(processes, pressure)
    elif check:
        health_check(load_app(app_spec, redis_url), health_port)
    elif reload:
        start.reload(health_port, _metrics_argv(metrics_port, metrics_tenants, metrics_top_n))
    else:
        start.serve(
            health_port=health_port,
            metrics_port=metrics_port,
            metrics_tenants=metrics_tenants,
            metrics_top_n=metrics_top_n,
            overrides=overrides,
        )


def _refuse_combinations(
    *,
    reload: bool,
    check: bool,
    burst: bool,
    processes: int | None,
    health_port: int | None,
    metrics_port: int | None,
) -> None:
    """A usage error for options that cannot go together, before anything starts."""
    if reload and (check or burst):
        fail("--reload cannot be combined with --check or --burst", EXIT_USAGE)
    if processes is not None and (reload or check):
        fail("--processes cannot be combined with --reload or --check", EXIT_USAGE)
    if processes is None or processes <= 1:
        return
    if health_port is not None:
        fail(
            "--processes cannot be combined with --health-port: the worker processes "
            "would all bind the same port (use `fairlane worker --check` instead)",
            EXIT_USAGE,
        )
    if metrics_port is not None:
        fail(
            "--processes cannot be combined with --metrics-port: the worker processes "
            "would all bind the same port (run one worker per port instead)",
            EXIT_USAGE,
        )


@dataclass(frozen=True, slots=True)
class _Start:
    """What every way of starting workers shares: the app, its lanes and slots, the
    server, and the pressure options a child worker is given."""

    app_spec: str
    lanes: str | None
    concurrency: int | None
    burst: bool
    redis_url: str | None
    verbose: bool
    pressure_argv: list[str]

    def supervise(self, processes: int, pressure: PressureConfig) -> None:
        """``processes`` child workers under a supervisor."""
        argv = list(self.pressure_argv)
        if pressure.enabled and pressure.memory_limit is None:
            # the children share the container's memory: each holds back at its share
            share = detect_memory_limit().bytes // processes
            argv += ["--memory-limit", str(share)]
        supervise(
            self.app_spec,
            processes,
            lanes=self.lanes,
            concurrency=self.concurrency,
            burst=self.burst,
            redis_url=self.redis_url,
            verbose=self.verbose,
            pressure=argv,
        )

    def reload(self, health_port: int | None, metrics: list[str]) -> None:
        """A child worker, restarted when the code changes."""
        reload_on_changes(
            child_argv(
                self.app_spec,
                lanes=self.lanes,
                concurrency=self.concurrency,
                health_port=health_port,
                redis_url=self.redis_url,
                verbose=self.verbose,
                metrics=metrics,
                pressure=self.pressure_argv,
            )
        )

    def serve(
        self,
        *,
        health_port: int | None,
        metrics_port: int | None,
        metrics_tenants: str | None,
        metrics_top_n: int,
        overrides: dict[str, Any],
    ) -> None:
        """This process is the worker."""
        configure_logging(self.verbose)
        app = load_app(self.app_spec, self.redis_url)
        lane_list = split_lanes(self.lanes) if self.lanes is not None else None
        target = locate_server(app.settings, self.redis_url, app)
        if target.url is None:
            log.info("no Redis URL configured: using %s (starting it if needed)", target.source)
        else:
            log.info("using server %s (from %s)", redact_url(target.url), target.source)
        run(
            app.run_worker(
                lanes=lane_list,
                concurrency=self.concurrency,
                burst=self.burst,
                handle_signals=True,
                health_port=health_port,
                metrics_port=metrics_port,
                metrics=MetricsConfig(
                    tenants=frozenset(_split_names(metrics_tenants)), top_n=metrics_top_n
                ),
                pressure=_pressure_config(app.settings, overrides),
            )
        )


def _split_names(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def _metrics_argv(port: int | None, tenants: str | None, top_n: int) -> list[str]:
    if port is None:
        return []
    argv = ["--metrics-port", str(port), "--metrics-top-n", str(top_n)]
    return argv + (["--metrics-tenants", tenants] if tenants else [])


def _pressure_config(settings: Settings, overrides: dict[str, Any]) -> PressureConfig:
    """The worker.pressure settings with the command line's options on top."""
    try:
        changes = dict(overrides)
        if isinstance(changes.get("memory_limit"), str):
            changes["memory_limit"] = parse_size(changes["memory_limit"])
        return PressureConfig.from_settings(settings.worker.pressure, **changes)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


def _pressure_argv(overrides: dict[str, Any]) -> list[str]:
    """The options that give a child worker the same pressure options as this command."""
    argv: list[str] = []
    for key, value in overrides.items():
        if key == "enabled":
            argv.append("--backpressure" if value else "--no-backpressure")
        else:
            argv += ["--" + key.replace("_", "-"), str(value)]
    return argv
