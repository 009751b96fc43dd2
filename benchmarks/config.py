"""The parameters of one benchmark run, shared by both systems' phases."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from fairlane.store.redis import redact_url

PHASES = ("throughput", "latency", "enqueue", "idle", "recovery")


@dataclass(frozen=True, slots=True)
class Config:
    url: str
    jobs: int = 20_000
    concurrency: int = 100
    peers: bool = True
    phases: tuple[str, ...] = PHASES
    batch: int = 1_000  # enqueue_many batch size; taskiq's gather batch size
    run_id: str = field(default_factory=lambda: os.urandom(3).hex())
    timeout: float = 600.0  # longest wait for any one step
    settle: float = 0.5  # time a fresh worker gets to connect and block before measuring
    latency_samples: int = 1_000
    latency_warmup: int = 10
    latency_gap: float = 0.005  # pause between samples so the worker is blocked again
    idle_settle: float = 2.0
    idle_seconds: float = 10.0
    recovery_jobs: int = 200
    recovery_concurrency: int = 20
    recovery_task_s: float = 0.5
    recovery_kill_after: float = 1.0

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.concurrency < 1 or self.batch < 1:
            raise ValueError("jobs, concurrency and batch must be >= 1")
        unknown = set(self.phases) - set(PHASES)
        if unknown:
            raise ValueError(f"unknown phases {sorted(unknown)}; choose from {PHASES}")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["url"] = redact_url(self.url)
        return out
