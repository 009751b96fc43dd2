"""Invoker and task functions that the executor tests run inside executor children."""

from __future__ import annotations

import ctypes
import importlib
import os
import resource
import signal
import time
from typing import Any

import msgspec


def invoke(target: str, payload: bytes) -> bytes:
    """Resolve ``module:function``, call it with msgspec-JSON decoded args, encode the result."""
    module_name, _, func_name = target.partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    args: list[Any] = msgspec.json.decode(payload) if payload else []
    return msgspec.json.encode(func(*args))


def echo(*args: Any) -> list[Any]:
    return list(args)


def getpid() -> int:
    return os.getpid()


def sleep_then_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def fail(message: str) -> None:
    raise ValueError(message)


def sigint_ignored() -> bool:
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def segfault() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the work tree
    ctypes.string_at(0)


def hard_exit(code: int) -> None:
    os._exit(code)


def self_kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
