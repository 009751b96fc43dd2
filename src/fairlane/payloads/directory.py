"""``DirectoryPayloadStore``: payloads as files in a directory every process can reach.

The directory may be local (one machine) or a shared mount (NFS, EFS, a volume
shared by pods). A write goes to a temporary file in the target directory and is
renamed over the final name, so a reader sees a whole payload or none: rename is
atomic within one file system, shared mounts included. ``fsync=True`` flushes the
file and its directory before the job that references it is enqueued, for stores
that must survive a machine's crash; it costs a disk flush per payload.

Files are spread over 256 subdirectories by a hash of the name, so that no one
directory grows to millions of entries. File I/O runs in threads, off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from fairlane.codec.refs import check_name
from fairlane.payloads.base import PayloadMissing

__all__ = ["DirectoryPayloadStore"]


class DirectoryPayloadStore:
    """Payloads as files under ``root`` (created on first write)."""

    def __init__(self, root: Path | str, *, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"DirectoryPayloadStore({str(self.root)!r})"

    def path(self, name: str) -> Path:
        """Where the payload ``name`` is (or would be) kept."""
        check_name(name)
        shard = hashlib.blake2b(name.encode(), digest_size=1).hexdigest()
        return self.root / shard / name

    async def put(self, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._write, self.path(name), data)

    async def get(self, name: str) -> bytes:
        try:
            return await asyncio.to_thread(self.path(name).read_bytes)
        except FileNotFoundError:
            raise PayloadMissing(f"payload {name!r} is not in {self.root}") from None

    async def delete(self, names: Sequence[str]) -> None:
        paths = [self.path(name) for name in names]
        if paths:
            await asyncio.to_thread(_unlink_all, paths)

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a dot name: a half-written temporary file is never taken for a payload
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with temp.open("wb") as handle:
                handle.write(data)
                if self.fsync:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        if self.fsync:
            # the rename itself is durable only once the directory entry is flushed
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _unlink_all(paths: Sequence[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
