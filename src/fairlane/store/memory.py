"""The server's own word that it is full.

``out_of_memory`` tells the server's refusal of a write past ``maxmemory`` (the
``OOM`` error of a command, of a function call, of a script's write, of a command in
a pipeline); ``server_full`` makes one the ``StoreFull`` callers see.
"""

from __future__ import annotations

import random
from typing import Final

from redis.exceptions import OutOfMemoryError, ResponseError

from fairlane.errors import StoreFull
from fairlane.policy.admission.memory import store_full_retry_after
from fairlane.policy.admission.rejections import RetryAfterPolicy

__all__ = ["out_of_memory", "server_full"]

#: what the server says when it refuses a write past maxmemory, whatever wraps it
_OOM_TEXT: Final = "used memory > 'maxmemory'"
#: the Retry-After of a write the server refused: the depth of a server at its limit
_RETRY: Final = RetryAfterPolicy()


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a write because it is at ``maxmemory``."""
    if isinstance(exc, OutOfMemoryError):
        return True
    return isinstance(exc, ResponseError) and (str(exc).startswith("OOM") or _OOM_TEXT in str(exc))


def server_full(exc: BaseException) -> StoreFull:
    """The server's refusal of a write past ``maxmemory`` as ``StoreFull``."""
    wait = store_full_retry_after(1.0, random.random(), _RETRY)
    return StoreFull(
        "the store is full: the Redis server is at its memory limit (maxmemory) and "
        f"refused the write, so nothing was written ({exc})",
        wait,
    )
