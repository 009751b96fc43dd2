"""``WorkerMetrics``: the worker-side metrics, recorded on the worker's own path, and
``MetricsHooks``, which plugs them and the metrics endpoint into a worker.

Nothing here calls the server: every value comes from what the worker already holds
(the fetched job, the usage the attempt reported, its outcome, the settle codes). The
hot-path methods (``started``, ``used``, ``finished``, ``settled``) cost a few dictionary
look-ups and histogram observations per job; label children are cached. ``sample`` runs
once per ``sample_interval`` off the hot path: slot gauges, the oldest attempt's age,
the utilisation histogram, and the re-ranking of the busiest tenants. The values live
in plain Python counters (no lock per observation: the loop is the only writer) and
become metric families at scrape time, in the metrics server's thread (about 3 us per
job in all, where prometheus_client's own metric objects take a lock per bucket and per
counter).

What a worker records, beyond queue wait, durations, attempts and slots:

- ``fairlane_dispatched_jobs_total{lane,class,tenant}``: attempts this worker started
  (retries included: a retry is dispatched again). Summed over the workers, a tenant's
  part of the rate is its dispatch share, to read against the share its weight
  entitles it to (``fairlane_tenant_entitled_share``, read from the store).
- Raw usage as tasks report it through ``fairlane.context().report_usage``, by lane,
  class and tenant: ``fairlane_usage_input_tokens_total``,
  ``fairlane_usage_output_tokens_total``, ``fairlane_usage_tool_calls_total``,
  ``fairlane_usage_tool_seconds_total``, ``fairlane_usage_model_seconds_total``, and
  ``fairlane_usage_units_total``, the work units the attempts were priced at (wall time
  counting as tool seconds when it is the larger). Against the estimate: the store
  counts, per lane and class, what it estimated and what was used for the same jobs
  (``fairlane_work_units_estimated_total`` and ``fairlane_work_units_used_total``,
  ``fairlane.metrics.store``).
- ``fairlane_model_seconds{task}`` and ``fairlane_tool_seconds{task}``: per attempt,
  the model time and the tool time it reported (an attempt that reported none of one is
  not observed in it), so model time is told apart from tool time.
- ``fairlane_worker_oldest_attempt_age_seconds{lane}``: how long the oldest attempt
  running here has held its lease (0: none runs), sampled every sample interval; the
  largest over the workers is the fleet's oldest running lease.

Limits of what the worker knows without a server call: queue wait is measured from
enqueue, for first attempts only, so a job scheduled with
``delay``/``at`` counts its delay as waiting; the estimate admission reserved for a job
is not on the fetched job, so the worker records actual usage only, and the estimate
against it is counted by the server (per lane and class, not per tenant: a field per
tenant in the server's counters would not be bounded).

``tenant`` labels are bounded (``fairlane.metrics.tenants``): a tenant that drops out
of the busiest has its queue-wait series removed and its counters added to ``other``.

``MetricsHooks`` is a worker plug-in (``fairlane.runtime.hooks``): when the worker
begins to serve it makes the recorder, the store-side collector (``metrics/store.py``)
and the HTTP endpoint (``metrics/server.py``), samples the running jobs every
``sample_interval`` (``fairlane.runtime.services.MetricsSampler``), and passes the
worker's hot-path points to the recorder. The worker never imports this package.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fairlane.metrics.config import MetricsConfig
from fairlane.metrics.globalkeys import BalancerCollector
from fairlane.metrics.histograms import (
    DURATION_BUCKETS,
    RETRY_DELAY_BUCKETS,
    SATURATION_BUCKETS,
    UNIT_BUCKETS,
    WAIT_BUCKETS,
    Histogram,
    Histograms,
)
from fairlane.metrics.pressure import PressureCollector
from fairlane.metrics.server import MetricsServer
from fairlane.metrics.store import StoreCollector, StoreReader
from fairlane.metrics.tenants import OTHER, TenantLabels
from fairlane.policy.classes import ClassTable
from fairlane.registry import TaskDefinition
from fairlane.runtime.hooks import WorkerHooks, WorkerView
from fairlane.runtime.services import MetricsSampler
from fairlane.runtime.usage import JobContext
from fairlane.store.wire import FetchedJob, Outcome

__all__ = [
    "DURATION_BUCKETS",
    "SATURATION_BUCKETS",
    "UNIT_BUCKETS",
    "USAGE",
    "WAIT_BUCKETS",
    "Declared",
    "MetricsHooks",
    "WorkerMetrics",
]

log = logging.getLogger("fairlane.worker")
T = TypeVar("T")


class Declared(Protocol):
    """What the recorder reads of an app's declarations (a ``Registry``, or the ``App``)."""

    @property
    def tasks(self) -> Mapping[str, TaskDefinition[Any, Any]]: ...

    @property
    def lanes(self) -> Mapping[str, ClassTable]: ...


#: The usage counters, by (lane, class, tenant): family name suffix and help text.
USAGE = (
    ("input_tokens", "Input tokens attempts reported (fairlane.context().report_usage)."),
    ("output_tokens", "Output tokens attempts reported."),
    ("tool_calls", "Tool calls attempts reported."),
    ("tool_seconds", "Tool seconds attempts reported."),
    ("model_seconds", "Model seconds (time waiting for a model) attempts reported."),
    ("units", "Work units attempts were priced at (wall time counting as tool seconds)."),
)


#: The worker's histograms: family name, help, label names and bucket bounds.
_QUEUE_WAIT = (
    "fairlane_queue_wait_seconds",
    "Time from enqueue to the start of a job's first attempt.",
    ("lane", "class", "tenant"),
    WAIT_BUCKETS,
)
_DURATION = (
    "fairlane_task_duration_seconds",
    "Wall time of one attempt, by task.",
    ("task",),
    DURATION_BUCKETS,
)
_RETRY_DELAY = (
    "fairlane_retry_delay_seconds",
    "Backoff delay of attempts that failed and will be retried.",
    ("task",),
    RETRY_DELAY_BUCKETS,
)
_UNITS = (
    "fairlane_attempt_units",
    "Work units an attempt used (its reported usage, wall time as tool seconds).",
    ("task",),
    UNIT_BUCKETS,
)
_UTILIZATION_SAMPLED = (
    "fairlane_worker_slot_utilization",
    "The worker's slots in use / its slots, sampled every sample interval.",
    (),
    SATURATION_BUCKETS,
)
_MODEL_SECONDS = (
    "fairlane_model_seconds",
    "Model seconds one attempt reported, by task (attempts reporting none: not observed).",
    ("task",),
    DURATION_BUCKETS,
)
_TOOL_SECONDS = (
    "fairlane_tool_seconds",
    "Tool seconds one attempt reported, by task (attempts reporting none: not observed).",
    ("task",),
    DURATION_BUCKETS,
)


class WorkerMetrics(Collector):
    """One worker's metrics; ``registry`` holds them (several workers may share a process)."""

    def __init__(
        self,
        declared: Declared,
        lanes: Sequence[str],
        concurrency: int,
        config: MetricsConfig,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.declared = declared
        self.lanes = list(lanes)
        #: the server's clock minus this host's (ms), refreshed by ``sync_clock``: queue
        #: wait is measured from an enqueue stamped on the server's clock
        self.clock_offset_ms = 0.0
        self.concurrency = concurrency
        self.config = config
        self.tenants = TenantLabels(config.top_n, config.tenants)
        self.queue_wait = Histograms(*_QUEUE_WAIT)
        self.duration = Histograms(*_DURATION)
        self.retry_delay = Histograms(*_RETRY_DELAY)
        self.units = Histograms(*_UNITS)
        self.utilization_sampled = Histograms(*_UTILIZATION_SAMPLED)
        self._sampled = self.utilization_sampled.child()
        self.model_seconds = Histograms(*_MODEL_SECONDS)
        self.tool_seconds = Histograms(*_TOOL_SECONDS)
        #: (lane, class, tenant label) -> attempts started here
        self.dispatched: dict[tuple[str, str, str], int] = {}
        #: (lane, class, tenant label) -> the USAGE counters, in order
        self.usage: dict[tuple[str, str, str], list[float]] = {}
        #: job id -> when its attempt started here (monotonic), for the oldest lease's age
        self._began: dict[str, float] = {}
        self.oldest: dict[str, float] = dict.fromkeys(self.lanes, 0.0)  # lane -> s, sampled
        self.attempts: dict[tuple[str, str], int] = {}  # (task, outcome) -> attempts
        self.lease_lost = 0
        self.in_use: dict[str, int] = dict.fromkeys(self.lanes, 0)  # lane -> slots, sampled
        self._where: dict[str, tuple[str, str]] = {}  # task -> (lane, class)
        self._per_task: dict[str, tuple[Histogram, Histogram, Histogram]] = {}
        self._pending: dict[str, str] = {}  # job id -> task, finished but not yet settled
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    # -- hot path --------------------------------------------------------------------

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        """Jobs leased to the worker: their queue wait (first attempts)."""
        if not jobs:
            return
        now_ms = time.time() * 1000 + self.clock_offset_ms
        began, now = self._began, time.monotonic()
        tenants, child, dispatched = self.tenants, self.queue_wait.child, self.dispatched
        for job in jobs:
            tenants.count(job.tenant)
            began[job.id] = now
            lane, _ = self._place(job.task)
            cls = job.service_class  # the job's own: an enqueue may override the task's
            key = (lane, cls, tenants.label(job.tenant))
            dispatched[key] = dispatched.get(key, 0) + 1
            if job.attempt != 1:
                continue
            wait = (now_ms - job.enqueued_ms) / 1000
            child(*key).observe(wait if wait > 0 else 0.0)

    def used(self, job: FetchedJob, usage: JobContext, units: float) -> None:
        """An attempt's reported usage, and the units it was priced at."""
        key = (self._place(job.task)[0], job.service_class, self.tenants.label(job.tenant))
        counts = self.usage.get(key)
        if counts is None:
            counts = self.usage[key] = [0.0] * len(USAGE)
        counts[0] += usage.input_tokens
        counts[1] += usage.output_tokens
        counts[2] += usage.tool_calls
        counts[3] += usage.tool_seconds
        counts[4] += usage.model_seconds
        counts[5] += units
        if usage.model_seconds > 0:
            self.model_seconds.child(job.task).observe(usage.model_seconds)
        if usage.tool_seconds > 0:
            self.tool_seconds.child(job.task).observe(usage.tool_seconds)

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        """An attempt ended (``outcome`` None: its lease was lost; nothing is settled)."""
        self._began.pop(job.id, None)
        series = self._per_task.get(job.task)
        if series is None:
            name = job.task
            series = self._per_task[name] = (
                self.duration.child(name),
                self.retry_delay.child(name),
                self.units.child(name),
            )
        series[0].observe(seconds)
        if outcome is None:
            self._count(job.task, "lease_lost")
            return
        if outcome.kind == "retry":
            series[1].observe(outcome.delay_ms / 1000)
        if outcome.cost >= 0:
            series[2].observe(outcome.cost)
        self._pending[outcome.id] = job.task

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        """Outcomes the server settled; code 0 is a late write it fenced off."""
        pending, attempts = self._pending, self.attempts
        for outcome, code in zip(outcomes, codes, strict=False):
            key = (pending.pop(outcome.id, ""), "fenced" if code == 0 else outcome.kind)
            attempts[key] = attempts.get(key, 0) + 1

    def lost(self, n: int) -> None:
        self.lease_lost += n

    def _count(self, task: str, outcome: str) -> None:
        key = (task, outcome)
        self.attempts[key] = self.attempts.get(key, 0) + 1

    def sync_clock(self, server_ms: int, sent: float, received: float) -> None:
        """Take the offset of this host's clock from a server reading asked for at
        ``sent`` and answered at ``received`` (this host's ``time.time()``): the reading is
        placed halfway, so the error is at most half the round trip."""
        self.clock_offset_ms = server_ms - (sent + received) * 500

    def _place(self, task_name: str) -> tuple[str, str]:
        where = self._where.get(task_name)
        if where is None:
            task = self.declared.tasks.get(task_name)
            if task is None:
                where = (self.lanes[0], "")
            else:
                where = (task.options.lane, task.options.service_class)
            self._where[task_name] = where
        return where

    # -- periodic --------------------------------------------------------------------

    def sample(self, running: Iterable[FetchedJob]) -> None:
        """Slot gauges, the utilisation histogram and the oldest attempt's age;
        re-rank the busiest tenants."""
        used = dict.fromkeys(self.lanes, 0)
        oldest = dict.fromkeys(self.lanes, 0.0)
        now, began = time.monotonic(), self._began
        for job in running:
            lane = self._place(job.task)[0]
            used[lane] = used.get(lane, 0) + job.slots
            since = began.get(job.id)
            if since is not None:
                oldest[lane] = max(oldest.get(lane, 0.0), now - since)
        self.in_use, self.oldest = used, oldest
        self._sampled.observe(min(1.0, sum(used.values()) / self.concurrency))
        dropped = self.tenants.refresh()
        if dropped:
            series = self.queue_wait.series
            for key in [k for k in series if k[2] in dropped]:
                del series[key]
            _fold(self.dispatched, dropped, lambda held, n: held + n)
            _fold(
                self.usage, dropped, lambda held, n: [a + b for a, b in zip(held, n, strict=True)]
            )

    # -- scrape (the metrics server's thread) ----------------------------------------

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield self.queue_wait.family()
        yield self.duration.family()
        attempts = CounterMetricFamily(
            "fairlane_attempts",
            "Attempts settled, by task and outcome (ok, retry, dead, suspend, cancel, "
            "expire: stopped at the job's deadline, release; fenced: a late write the "
            "server rejected; lease_lost: never settled).",
            labels=["task", "outcome"],
        )
        for key, n in sorted(list(self.attempts.items())):
            attempts.add_metric(list(key), n)
        yield attempts
        yield self.retry_delay.family()
        yield self.units.family()
        lost = CounterMetricFamily(
            "fairlane_lease_lost", "Running attempts stopped because their lease was lost."
        )
        lost.add_metric([], self.lease_lost)
        yield lost
        yield from self._slots()
        yield from self._dispatched()
        yield self.model_seconds.family()
        yield self.tool_seconds.family()

    def _slots(self) -> Iterator[Metric]:
        """The worker's slots, those in use by lane, and its oldest attempt's age."""
        slots = GaugeMetricFamily("fairlane_worker_slots", "The worker's slots (its concurrency).")
        slots.add_metric([], self.concurrency)
        yield slots
        in_use = GaugeMetricFamily(
            "fairlane_worker_slots_in_use", "Slots held by running jobs, by lane.", labels=["lane"]
        )
        ratio = GaugeMetricFamily(
            "fairlane_worker_slot_utilization_ratio",
            "Slots in use by the lane's jobs / the worker's slots.",
            labels=["lane"],
        )
        for lane, n in sorted(self.in_use.items()):
            in_use.add_metric([lane], n)
            ratio.add_metric([lane], n / self.concurrency)
        yield in_use
        yield ratio
        yield self.utilization_sampled.family()
        oldest = GaugeMetricFamily(
            "fairlane_worker_oldest_attempt_age_seconds",
            "How long the oldest attempt running on this worker has held its lease, by lane "
            "(0: none runs).",
            labels=["lane"],
        )
        for lane, age in sorted(self.oldest.items()):
            oldest.add_metric([lane], age)
        yield oldest

    def _dispatched(self) -> Iterator[Metric]:
        """Attempts started here and the usage they reported, by lane, class and tenant."""
        dispatched = CounterMetricFamily(
            "fairlane_dispatched_jobs",
            "Attempts this worker started, by lane, class and tenant (retries included).",
            labels=["lane", "class", "tenant"],
        )
        for where, n in sorted(list(self.dispatched.items())):
            dispatched.add_metric(list(where), n)
        yield dispatched
        usage = sorted(list(self.usage.items()))
        for i, (name, doc) in enumerate(USAGE):
            family = CounterMetricFamily(
                f"fairlane_usage_{name}", doc, labels=["lane", "class", "tenant"]
            )
            for where, counts in usage:
                family.add_metric(list(where), counts[i])
            yield family


def _fold(
    series: dict[tuple[str, str, str], T], dropped: set[str], add: Callable[[T, T], T]
) -> None:
    """Move the counters of tenants that lost their label into ``other``'s (a counter
    keeps growing where it is summed; only its split by tenant changes)."""
    for key in [k for k in series if k[2] in dropped]:
        counts = series.pop(key)
        into = (key[0], key[1], OTHER)
        series[into] = add(series[into], counts) if into in series else counts


class MetricsHooks(WorkerHooks):
    """A worker's metrics: the recorder on its hot path, and ``/metrics`` and
    ``/autoscale`` served on ``port`` (0: a free one) while it serves."""

    def __init__(  # noqa: PLR0917 - where the endpoint reads from
        self,
        declared: Declared,
        port: int,
        config: MetricsConfig,
        url: Callable[[], str],
        app: str,
        shards: int,
        server_time_ms: Callable[[], Awaitable[int]],
    ) -> None:
        self.declared = declared
        self.port = port
        self.config = config
        self._url = url
        self._app = app
        self._shards = shards
        self._server_time_ms = server_time_ms
        self.recorder: WorkerMetrics | None = None
        self.server: MetricsServer | None = None

    def serving(self, worker: WorkerView, stack: AsyncExitStack) -> list[Coroutine[Any, Any, None]]:
        config, declared = self.config, self.declared
        metrics = WorkerMetrics(declared, worker.lanes, worker.concurrency, config)
        lanes = [*worker.lanes, *declared.lanes, *(t.options.lane for t in declared.tasks.values())]
        reader = StoreReader(
            self._url(),
            self._app,
            lanes,
            timeout=config.store_timeout,
            max_age=config.store_max_age,
            shards=self._shards,
            tables=declared.lanes,
            horizon=config.horizon,
        )
        stack.callback(reader.close)
        metrics.registry.register(StoreCollector(reader, config.key_top_n, config.top_n))
        if worker.pressure is not None:
            metrics.registry.register(PressureCollector(worker.pressure))
        if worker.balancer is not None:
            metrics.registry.register(BalancerCollector(worker.balancer))
        server = MetricsServer(self.port, metrics.registry, reader, config.host)
        server.start()
        stack.callback(server.stop)
        self.recorder, self.server = metrics, server
        log.info("worker %s serving /metrics and /autoscale on port %d", worker.id, server.port)
        sampler = MetricsSampler(
            metrics, worker.running_jobs, self._server_time_ms, config.sample_interval
        )
        return [sampler.run(worker.closed)]

    # the recorder is made by ``serving``, before the worker leases anything

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        if self.recorder is not None:
            self.recorder.started(jobs)

    def used(self, job: FetchedJob, usage: JobContext, units: float) -> None:
        if self.recorder is not None:
            self.recorder.used(job, usage, units)

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        if self.recorder is not None:
            self.recorder.finished(job, outcome, seconds)

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        if self.recorder is not None:
            self.recorder.settled(outcomes, codes)

    def lost(self, n: int) -> None:
        if self.recorder is not None:
            self.recorder.lost(n)
