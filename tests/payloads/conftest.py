"""Fixtures of the payload tests: the payload stores they run against.

``payload_store`` is parametrized over a directory store (a fresh temporary
directory per test) and an S3 store on a local S3-compatible server: moto's
standalone server, started once per session as its own process, with a fresh
bucket per test. The S3 case is skipped only when moto's server is not installed.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairlane.payloads import PayloadStore
from fairlane.payloads.directory import DirectoryPayloadStore
from fairlane.payloads.s3 import S3PayloadStore

# moto's server takes any credentials; these only keep boto3 from looking for real ones
S3_OPTIONS = {
    "aws_access_key_id": "fairlane-test",
    "aws_secret_access_key": "fairlane-test",
    "region": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _moto_server() -> str | None:
    beside = Path(sys.executable).parent / "moto_server"
    return str(beside) if beside.exists() else shutil.which("moto_server")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a local S3-compatible server, for this session."""
    binary = _moto_server()
    if binary is None:
        pytest.skip("moto's server is not installed (pip install 'moto[server]')")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def s3_store(endpoint: str, bucket: str | None = None) -> PayloadStore:
    bucket = bucket or "fl-" + secrets.token_hex(6)
    store = S3PayloadStore(
        bucket,
        prefix="payloads",
        endpoint_url=endpoint,
        region=S3_OPTIONS["region"],
        aws_access_key_id=S3_OPTIONS["aws_access_key_id"],
        aws_secret_access_key=S3_OPTIONS["aws_secret_access_key"],
    )
    store.client.create_bucket(Bucket=bucket)
    return store


@pytest.fixture(params=["directory", "s3"])
def payload_store(request: pytest.FixtureRequest, tmp_path: Path) -> PayloadStore:
    if request.param == "directory":
        return DirectoryPayloadStore(tmp_path / "payloads")
    return s3_store(request.getfixturevalue("s3_endpoint"))
