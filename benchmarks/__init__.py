"""Fairlane's benchmark suite: Fairlane and taskiq-redis measured on one server in one run.

Run it with ``python -m benchmarks`` from the repository root or with ``fairlane bench``;
``benchmarks/README.md`` describes each figure and how it is measured.
"""
