"""Fairlane's benchmark suite: Fairlane, arq, SAQ, streaq and taskiq-redis on one server.

Run it with ``python -m benchmarks`` from the repository root or with ``fairlane bench``;
``benchmarks/README.md`` describes each figure and how it is measured.
"""
