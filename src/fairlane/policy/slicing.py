"""When a workflow's slice ends: the budget of new work one lease may do.

A run holds a worker slot only while a slice runs. A slice may start new steps until
it has done ``steps`` of them or ``seconds`` have passed since it began; the next step
then yields the slot, and the run re-enters fair dispatch behind its tenant's queued
work. Replayed steps are free: only new work is counted. The first new step of a slice
always runs, so every slice makes progress. Time is passed in.
"""

from __future__ import annotations

import msgspec

__all__ = ["SliceBudget"]


class SliceBudget(msgspec.Struct):
    """One slice's budget: ``steps`` new steps or ``seconds`` from ``started``."""

    seconds: float
    steps: int
    started: float
    steps_done: int = 0

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"a slice needs seconds > 0, got {self.seconds}")
        if self.steps < 1:
            raise ValueError(f"a slice needs steps >= 1, got {self.steps}")

    def spent(self, now: float) -> bool:
        """Whether the slice must yield before starting another step at ``now``."""
        if self.steps_done == 0:
            return False
        return self.steps_done >= self.steps or now - self.started >= self.seconds

    def step_done(self) -> None:
        self.steps_done += 1
