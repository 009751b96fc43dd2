"""A tiny example app: the tasks behind the README quickstart and ``fairlane example``.

Three typed tasks on two lanes: ``classify`` (async, a stand-in for a model call),
``flaky`` (fails the first time it sees a key, then succeeds: a retry in action) and
``embed`` (a plain synchronous function, run in the worker's thread pool).

Run a worker for it with ``fairlane worker fairlane.example:app --lanes light,heavy``;
``fairlane example`` enqueues jobs for a few tenants and runs a worker in-process.
"""

from __future__ import annotations

import asyncio
import hashlib
import random

from fairlane.app import App
from fairlane.policy.backoff import Backoff

__all__ = ["app", "classify", "embed", "flaky"]

app = App("example")

_COMPLAINT_WORDS = ("refund", "broken", "late", "angry", "cancel")
_seen: set[str] = set()  # keys that ``flaky`` has already failed once, in this process


@app.task(lane="light", timeout=10)
async def classify(text: str) -> str:
    """Label a message: question, complaint or statement."""
    await asyncio.sleep(random.uniform(0.002, 0.02))  # stands in for a model call
    lowered = text.lower().strip()
    if lowered.endswith("?"):
        return "question"
    if any(word in lowered for word in _COMPLAINT_WORDS):
        return "complaint"
    return "statement"


@app.task(lane="light", attempts=3, backoff=Backoff(base=0.2, cap=1.0))
async def flaky(key: str) -> str:
    """Fail the first attempt for each key with a transient error; the retry succeeds."""
    if key not in _seen:
        _seen.add(key)
        raise ConnectionError(f"upstream hiccup while enriching {key} (a retry will succeed)")
    return f"enriched {key}"


@app.task(lane="heavy", executor="thread", timeout=30)
def embed(text: str) -> list[float]:
    """A synchronous, CPU-bound stand-in for an embedding: runs in the worker's thread pool."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(byte / 255, 3) for byte in digest[:8]]
