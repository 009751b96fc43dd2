"""The worker an app runs: the runtime's ``Worker`` given the app's declarations and
stores, with the tracing and metrics plug-ins in it.

This is where the cross-cutting concerns are wired: the runtime defines the points a
worker reports (``fairlane.runtime.hooks``) and never imports tracing or metrics;
``Worker`` here plugs in ``fairlane.tracing``'s spans always (they cost a clock read
while tracing is off) and ``fairlane.metrics``' recorder and endpoint when asked for a
metrics port, and gives the cron loop the app's own ``enqueue``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fairlane.metrics.config import MetricsConfig
from fairlane.registry import Registry
from fairlane.runtime import worker as runtime
from fairlane.runtime.hooks import WorkerHooks
from fairlane.runtime.pressure import PressureConfig, Sensor
from fairlane.store.shards import ShardedStores
from fairlane.tracing import TracingHooks

if TYPE_CHECKING:
    from fairlane.metrics.recorder import MetricsHooks
    from fairlane.metrics.server import MetricsServer

__all__ = ["Worker", "WorkerApp"]


class WorkerApp(Protocol):
    """What a worker uses of the app it serves (``fairlane.app.App``)."""

    @property
    def name(self) -> str: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def sharded(self) -> ShardedStores: ...

    @property
    def url(self) -> str | None: ...

    def resolve_url(self) -> str: ...

    async def enqueue(self, task_name: str, /, *args: Any, **kwargs: Any) -> object: ...


class Worker(runtime.Worker):
    """Runs jobs of an app's lanes until stopped (``fairlane.runtime.worker.Worker``).

    ``metrics_port`` serves Prometheus ``/metrics`` and ``/autoscale`` on that port
    (0: a free one; ``metrics_server`` says which); ``metrics`` sets how tenants are
    labelled.
    """

    def __init__(
        self,
        app: WorkerApp,
        *,
        lanes: Sequence[str],
        concurrency: int,
        burst: bool = False,
        health_port: int | None = None,
        metrics_port: int | None = None,
        metrics: MetricsConfig | None = None,
        pressure: PressureConfig | None = None,
        sensors: Sequence[Sensor] | None = None,
    ) -> None:
        registry = app.registry
        hooks: list[WorkerHooks] = [TracingHooks(registry.tasks)]
        self._metrics: MetricsHooks | None = None
        if metrics_port is not None:
            # prometheus_client comes with the recorder: only a worker that serves it pays
            from fairlane.metrics.recorder import MetricsHooks  # noqa: PLC0415

            self._metrics = MetricsHooks(
                registry,
                metrics_port,
                metrics or MetricsConfig(),
                lambda: app.url or app.resolve_url(),
                app.name,
                registry.shards,
                # looked up when sampled, not now: the app's stores may open later
                lambda: app.sharded.store.server_time_ms(),  # noqa: PLW0108
            )
            hooks.append(self._metrics)
        super().__init__(
            registry,
            app.sharded,
            lanes=lanes,
            concurrency=concurrency,
            burst=burst,
            health_port=health_port,
            pressure=pressure,
            sensors=sensors,
            hooks=hooks,
            enqueue=app.enqueue,
        )

    @property
    def metrics_server(self) -> MetricsServer | None:
        """The metrics endpoint, once the worker serves it (None without a port)."""
        return None if self._metrics is None else self._metrics.server
