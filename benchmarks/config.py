"""The parameters of one suite run: which systems and scenarios, sizes, repetitions."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from benchmarks.venvs import PEERS, SYSTEMS
from fairlane.store.api import redact_url

#: scenarios every system runs, in this order within a repetition
SHARED = ("throughput", "latency", "noisy", "memory", "startup")
#: scenarios only Fairlane has (server time per entry point, tenants, admission, throttle
#: keys); ``profile`` runs the throughput shape again under a full SLOWLOG, ``keyed`` with
#: throttle, rate and fairness keys on every job, ``backlog`` drains backlogs of different
#: sizes; ``limit`` is no system's: the yardstick's drain (benchmarks/yardstick.py), the
#: machine's limit for a Redis queue
FAIRLANE_ONLY = (
    "limit", "profile", "tenants", "submit", "overload", "shared_key", "upstream", "keyed",
    "backlog",
)  # fmt: skip
#: the yardstick's modes, which the ``limit`` scenario runs in place of systems
LIMIT_MODES = ("fifo", "fair")
SCENARIOS = SHARED + FAIRLANE_ONLY

#: ``--quick``: small sizes and one repetition, a smoke test in seconds
QUICK: dict[str, Any] = {
    "reps": 1,
    "jobs": 500,
    "batch": 100,
    "latency_samples": 30,
    "latency_warmup": 3,
    "latency_budget": 3.0,
    "settle": 0.5,
    "flood": 100,
    "quiet": 5,
    "tenant_counts": (1, 100),
    "tenant_jobs": 500,
    "backlog_sizes": (500, 2_000),
    "backlog_tenants": 10,
    "submit_processes": 2,
    "submit_seconds": 1.0,
    "overload_seconds": 1.5,
    "shared_flood": 100,
    "shared_quiet": 8,
    "shared_job_ms": 50.0,
    "shared_gap_ms": 100.0,
    "upstream_n": 20.0,
    "upstream_seconds": 2.0,
    "keyed_fairness_keys": 10,
    "limit_tenants": 250,  # two jobs a tenant, as 20,000 jobs over 10,000
    "memory_jobs": 5_000,
    "startup_samples": 2,
    # a smoke test does not make Fairlane's environment (venvs.py)
    "fairlane_env": "suite",
}
#: where Fairlane runs: an environment of its own, as each peer (venvs.py), or the suite's
FAIRLANE_ENVS = ("own", "suite")


@dataclass(frozen=True, slots=True)
class Config:
    url: str
    reps: int = 3
    quick: bool = False
    peers: tuple[str, ...] = PEERS
    scenarios: tuple[str, ...] = SCENARIOS
    # (1) throughput: no-op jobs enqueued in batches, then drained by one worker; the
    # same shape again for ``profile`` (benchmarks/serverprofile.py)
    jobs: int = 20_000
    concurrency: int = 100
    batch: int = 1_000
    # (2) enqueue -> start latency with an idle worker
    latency_samples: int = 1_000
    latency_warmup: int = 10
    latency_gap: float = 0.005
    latency_budget: float = 30.0  # seconds per run at most (a polling peer is slow)
    settle: float = 1.0  # seconds a fresh worker gets to connect before sampling
    # (3) noisy neighbor
    flood: int = 2_000
    flood_ms: float = 50.0
    quiet: int = 20
    quiet_ms: float = 5.0
    noisy_concurrency: int = 20
    # (4) Fairlane alone: tenants, submit
    tenant_counts: tuple[int, ...] = (1, 100, 10_000, 100_000)
    tenant_jobs: int = 20_000
    # Fairlane alone: backlogs of these sizes over the same tenants, each drained by one
    # worker (benchmarks/tenants.py's drain); the first is the one the others are put over
    backlog_sizes: tuple[int, ...] = (20_000, 1_000_000)
    backlog_tenants: int = 100
    submit_processes: int = 4
    submit_seconds: float = 5.0
    # (5) Fairlane alone: overload with and without admission
    overload_slots: int = 16
    overload_seconds: float = 8.0
    # (6) Fairlane alone: quiet tenants behind a flood on a shared throttle key
    shared_limit: int = 4
    shared_flood: int = 400
    shared_quiet: int = 40
    shared_job_ms: float = 100.0
    shared_gap_ms: float = 200.0
    # (7) Fairlane alone: tenants calling a rate-limited upstream on loopback, four ways
    upstream_n: float = 40.0  # its calls per second
    upstream_seconds: float = 30.0  # work per way at its capacity: Adaptive's target is 30 s
    upstream_latency: float = 0.2
    upstream_tenants: int = 4
    upstream_concurrency: int = 64
    # (8) Fairlane alone: the throughput shape with throttle, rate and fairness keys on
    # every job, against the plain shape in the same run (benchmarks/keyed.py)
    keyed_fairness_keys: int = 100
    # (9) the yardstick (benchmarks/yardstick.py): ``jobs`` at ``concurrency`` through a
    # minimal Redis queue, FIFO and fair over this many tenants
    limit_tenants: int = 10_000
    # (9) the server memory a waiting job costs: jobs enqueued in batches of ``batch``, no
    # worker running, ``used_memory`` before and after
    memory_jobs: int = 100_000
    # (10) a worker's start-up: spawned with one job waiting, from the spawn to that
    # job's start, this many times a repetition
    startup_samples: int = 5
    timeout: float = 900.0  # longest wait for one scenario run
    seed: int | None = None  # of the shuffles (None: random)
    peers_dir: str | None = None
    fairlane_env: str = "own"
    run_id: str = field(default_factory=lambda: os.urandom(3).hex())

    def __post_init__(self) -> None:
        unknown_peers = set(self.peers) - set(PEERS)
        if unknown_peers:
            raise ValueError(f"unknown peers {sorted(unknown_peers)}; choose from {PEERS}")
        unknown = set(self.scenarios) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown phases {sorted(unknown)}; choose from {SCENARIOS}")
        if self.fairlane_env not in FAIRLANE_ENVS:
            raise ValueError(f"fairlane_env must be one of {FAIRLANE_ENVS}")
        if self.reps < 1 or self.jobs < 1 or self.concurrency < 1 or self.batch < 1:
            raise ValueError("reps, jobs, concurrency and batch must be >= 1")

    @classmethod
    def make(cls, url: str, *, quick: bool = False, **options: Any) -> Config:
        """A config; ``quick`` starts from the small sizes of ``QUICK``, options override."""
        known = {f.name for f in fields(cls)}
        bad = set(options) - known
        if bad:
            raise TypeError(f"unknown options {sorted(bad)}")
        base = {**(QUICK if quick else {}), **{k: v for k, v in options.items() if v is not None}}
        for key in ("peers", "scenarios", "tenant_counts", "backlog_sizes"):
            if key in base:
                base[key] = tuple(base[key])
        return replace(cls(url=url, quick=quick), **base)

    @property
    def systems(self) -> tuple[str, ...]:
        return ("fairlane", *self.peers)

    def label(self, system: str) -> str:
        return SYSTEMS[system].label

    def params(self) -> dict[str, Any]:
        """What every driver gets (it reads the fields its scenario needs)."""
        out = asdict(self)
        out["tenant_counts"] = list(self.tenant_counts)
        out["samples"], out["warmup"] = self.latency_samples, self.latency_warmup
        out["gap"], out["budget"] = self.latency_gap, self.latency_budget
        return out

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["url"] = redact_url(self.url)
        return out
