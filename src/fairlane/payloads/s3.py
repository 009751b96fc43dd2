"""``S3PayloadStore``: payloads as objects in an S3-compatible bucket (the ``s3`` extra).

Any S3-compatible service works (AWS S3, MinIO, Ceph, R2, ...): ``endpoint_url``
points elsewhere than AWS. Credentials and the region come from boto3's usual
sources (environment, shared config, instance roles) unless given here.

It drives boto3's client from threads rather than using an asyncio S3 client:
a boto3 client is thread-safe and shared by all calls, boto3 is what deployments
already install and configure, and asyncio S3 clients pin narrow ranges of
botocore that conflict with it. A payload moves once per job, so a thread hop per
call costs nothing next to the transfer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fairlane.codec.refs import check_name
from fairlane.payloads.base import PayloadError, PayloadMissing

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3PayloadStore"]

_DELETE_BATCH = 1000  # the most keys one DeleteObjects call takes


class S3PayloadStore:
    """Payloads as objects ``<prefix>/<name>`` in ``bucket``."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: S3Client | None = None,
        **client_options: Any,
    ) -> None:
        if not bucket:
            raise ValueError("an S3 payload store needs a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if client is None:
            try:
                import boto3  # noqa: PLC0415 - the optional extra, needed only here
            except ImportError:
                raise ImportError(
                    "the S3 payload store needs boto3: pip install 'fairlane[s3]'"
                ) from None
            client = boto3.client(
                "s3", endpoint_url=endpoint_url, region_name=region, **client_options
            )
        self.client: S3Client = client

    def __repr__(self) -> str:
        return f"S3PayloadStore({self.bucket!r}, prefix={self.prefix!r})"

    def key(self, name: str) -> str:
        return self.prefix + check_name(name)

    async def put(self, name: str, data: bytes) -> None:
        key = self.key(name)
        try:
            await asyncio.to_thread(self.client.put_object, Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise PayloadError(
                f"cannot store payload {name!r} in s3://{self.bucket}: {exc}"
            ) from exc

    async def get(self, name: str) -> bytes:
        key = self.key(name)
        try:
            return await asyncio.to_thread(self._read, key)
        except self.client.exceptions.NoSuchKey:
            raise PayloadMissing(f"payload {name!r} is not in s3://{self.bucket}") from None
        except Exception as exc:
            raise PayloadError(
                f"cannot read payload {name!r} from s3://{self.bucket}: {exc}"
            ) from exc

    async def delete(self, names: Sequence[str]) -> None:
        keys = [self.key(name) for name in names]
        for first in range(0, len(keys), _DELETE_BATCH):
            batch = keys[first : first + _DELETE_BATCH]
            await asyncio.to_thread(self._delete, batch)

    def _read(self, key: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            return body.read()
        finally:
            body.close()

    def _delete(self, keys: list[str]) -> None:
        try:
            reply = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
            )
        except Exception as exc:
            raise PayloadError(f"cannot delete payloads from s3://{self.bucket}: {exc}") from exc
        errors = reply.get("Errors") or []
        if errors:
            first = errors[0]
            raise PayloadError(
                f"could not delete {len(errors)} payload(s) from s3://{self.bucket}: "
                f"{first.get('Key')}: {first.get('Message')}"
            )
