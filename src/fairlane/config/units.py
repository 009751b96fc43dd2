"""Sizes written the way people write them, read as numbers.

This module owns the parsing of a size (``"2GiB"``, ``"512m"``, ``"2GB"``) into bytes, for
settings such as ``worker.pressure.memory_limit`` and the worker's ``--memory-limit``. It
imports nothing of the project, so any floor may use it without a cycle. Durations
(``"90s"``, ``"7d"``) are read by ``fairlane.policy.retention.parse_duration``: retention
is their one user, and the policy core imports nothing above it.
"""

from __future__ import annotations

__all__ = ["parse_size"]

# Docker's one-letter units are binary, as its "512m" means 512 MiB; "kb", "mb", ... are SI.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def parse_size(text: str) -> int:
    """Bytes from ``"2147483648"``, ``"512MiB"``, ``"2GB"`` or Docker's ``"512m"`` (binary)."""
    raw = text.strip().lower().replace(" ", "")
    digits = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(digits) :]
    if unit not in _SIZE_UNITS or not digits:
        raise ValueError(f"not a size: {text!r} (e.g. 2147483648, 512MiB, 2GB, 512m)")
    try:
        value = float(digits)
    except ValueError:
        raise ValueError(f"not a size: {text!r}") from None
    size = int(value * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"a size must be above 0, got {text!r}")
    return size
