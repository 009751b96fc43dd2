"""The loop Fairlane's own processes run on (``fairlane.runtime.loop``): what a process
built before its first loop is moved out of the collector's generations, once."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import gc
from fairlane.runtime.loop import run

async def frozen() -> int:
    return gc.get_freeze_count()

before = gc.get_freeze_count()
first = run(frozen())
garbage = [[] for _ in range(10_000)]
second = run(frozen())
print(before, first, second)
"""


def test_the_first_loop_freezes_what_was_built_and_a_later_one_nothing_more() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    before, first, second = (int(n) for n in done.stdout.split())
    assert before == 0
    # the imports alone are tens of thousands of objects
    assert first > 10_000
    # a later loop freezes nothing more (a frozen object may still be freed)
    assert second <= first
