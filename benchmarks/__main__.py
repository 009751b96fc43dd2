"""``python -m benchmarks``: run the suite from the repository root (see README.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import DEFAULT_URL
from benchmarks.config import PHASES


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark Fairlane against taskiq-redis on one Redis/Valkey server.",
    )
    parser.add_argument("--redis-url", default=DEFAULT_URL, help=f"default {DEFAULT_URL}")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per throughput/enqueue run")
    parser.add_argument("--concurrency", type=int, default=100, help="worker concurrency")
    parser.add_argument(
        "--no-peers", dest="peers", action="store_false", help="measure Fairlane only"
    )
    parser.add_argument(
        "--phase",
        dest="phases",
        action="append",
        choices=PHASES,
        help="run only this phase (repeatable); default: all",
    )
    parser.add_argument("--latency-samples", type=int, default=1_000)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON file or directory (default benchmarks/results/)",
    )
    args = parser.parse_args(argv)

    from fairlane.bench import run_bench  # noqa: PLC0415 - after --help, which needs none

    run_bench(
        args.redis_url,
        args.jobs,
        args.concurrency,
        args.peers,
        args.out,
        phases=args.phases,
        latency_samples=args.latency_samples,
        idle_seconds=args.idle_seconds,
    )


if __name__ == "__main__":
    main()
