"""``python -m benchmarks``: run the suite from the repository root (see README.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.common import DEFAULT_URL
from benchmarks.config import SCENARIOS
from benchmarks.venvs import PEERS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Benchmark Fairlane against arq, SAQ, streaq and taskiq-redis on one "
            "Redis/Valkey server, interleaved, median of several repetitions."
        ),
    )
    parser.add_argument("--redis-url", default=DEFAULT_URL, help=f"default {DEFAULT_URL}")
    parser.add_argument(
        "--peers", dest="peers", action="store_true", default=True, help="measure the peers too"
    )
    parser.add_argument(
        "--no-peers", dest="peers", action="store_false", help="measure Fairlane only"
    )
    parser.add_argument(
        "--peer",
        dest="peer",
        action="append",
        choices=PEERS,
        help="measure only this peer (repeatable); default: all",
    )
    parser.add_argument(
        "--phase",
        dest="phases",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario (repeatable); default: all",
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--jobs", type=int, default=None, help="throughput jobs (default 20,000)")
    parser.add_argument("--concurrency", type=int, default=None, help="default 100")
    parser.add_argument("--seed", type=int, default=None, help="seed of the interleaving")
    parser.add_argument("--peers-dir", default=None, help="where the peers' environments live")
    parser.add_argument(
        "--fairlane-env",
        choices=("own", "suite"),
        default=None,
        help="Fairlane in an environment of its own (default) or the suite's interpreter",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON file or directory (default benchmarks/results/); a .md file goes beside it",
    )
    args = parser.parse_args(argv)

    from fairlane.cli.bench import run_bench  # noqa: PLC0415 - after --help, which needs none

    run_bench(
        args.redis_url,
        peers=args.peer if args.peers and args.peer else args.peers,
        reps=args.reps,
        quick=args.quick,
        phases=args.phases,
        out=args.out,
        jobs=args.jobs,
        concurrency=args.concurrency,
        seed=args.seed,
        peers_dir=args.peers_dir,
        fairlane_env=args.fairlane_env,
    )


if __name__ == "__main__":
    main()
