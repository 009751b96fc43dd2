"""References and stores without a worker: encoding round trips, names that must be
refused, a store's put/get/delete, and opening stores from URLs."""

from __future__ import annotations

import asyncio
import hashlib
import string
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.codec import ArgsCodec, PayloadTooLarge
from fairlane.codec.refs import (
    MalformedReference,
    PayloadRef,
    check_name,
    decode_ref,
    encode_ref,
    is_ref,
    new_name,
)
from fairlane.config.settings import PayloadSettings
from fairlane.payloads import PayloadMissing, PayloadStore, open_store
from fairlane.payloads.directory import DirectoryPayloadStore
from fairlane.payloads.offload import Payloads
from fairlane.store.payloadindex import index_member, split_member

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(
    job_id=st.text(min_size=1, max_size=300),
    kind=st.sampled_from(["args", "result"]),
    size=st.integers(min_value=0, max_value=2**40),
    data=st.binary(max_size=64),
)
def test_a_reference_round_trips_for_any_job_id(
    job_id: str, kind: str, size: int, data: bytes
) -> None:
    name = new_name(job_id, kind)
    assert check_name(name) == name  # whatever the id holds, the name is safe
    ref = PayloadRef(name, size, hashlib.sha256(data).hexdigest())
    blob = encode_ref(ref)
    assert is_ref(blob) and is_ref(blob.decode())
    assert decode_ref(blob) == ref
    assert split_member(index_member(job_id, name)) == (job_id, name)


@pytest.mark.parametrize("job_id", ["5XIZeWagjV7iJG3-", "5XIZeWagjV7iJG3_", "s2.5XIZeWagjV7iJG3-"])
def test_a_payload_name_keeps_the_whole_job_id(job_id: str) -> None:
    # ids are base64 over '-0-9A-Z_a-z': one in 32 ends in '-' or '_'
    assert new_name(job_id, "args").startswith(f"{job_id}.args.")


@settings(max_examples=60, deadline=None)
@given(value=json_values)
def test_only_a_value_sent_by_reference_can_begin_like_one(value: object) -> None:
    """Inline values are never taken for references: any that begins like one is
    sent by reference however small, and comes back as itself."""
    blob = msgspec.json.encode(value)
    payloads = Payloads(DirectoryPayloadStore("/nonexistent"), PayloadSettings())
    assert payloads.by_reference(blob) or not is_ref(blob)


def test_references_to_unsafe_names_are_refused() -> None:
    sha = "0" * 64
    for name in ["../etc/passwd", "a/b", "", ".hidden", "a..b", "x" * 201, "a b", "é"]:
        blob = b'{"$fl_ref":' + msgspec.json.encode(name) + b',"size":1,"sha256":"' + sha.encode()
        with pytest.raises(MalformedReference):
            decode_ref(blob + b'"}')
    for bad in [
        b'{"$fl_ref":"ok","size":1}',  # no digest
        b'{"$fl_ref":"ok","size":-1,"sha256":"' + sha.encode() + b'"}',
        b'{"$fl_ref":"ok","size":1,"sha256":"' + sha.encode() + b'","x":1}',
        b'{"$fl_ref":1}',
        b'{"$fl_ref":"ok"',
    ]:
        with pytest.raises(MalformedReference):
            decode_ref(bad)


def test_a_damaged_payload_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = DirectoryPayloadStore(tmp_path)
        payloads = Payloads(store, PayloadSettings())
        data = b"payload" * 100
        ref = encode_ref(PayloadRef("j.args.1", len(data), hashlib.sha256(data).hexdigest()))
        with pytest.raises(PayloadMissing, match="not in"):
            await payloads.resolve(ref)
        await store.put("j.args.1", data)
        assert await payloads.resolve(ref) == data
        await store.put("j.args.1", data[:-1] + b"X")
        with pytest.raises(PayloadMissing, match="damaged"):
            await payloads.resolve(ref)
        assert await payloads.resolve(b'{"a":1}') == b'{"a":1}'  # no reference: itself

    asyncio.run(scenario())


@settings(max_examples=15, deadline=None)
@given(names=st.lists(st.text(string.ascii_letters + string.digits, min_size=1), max_size=8))
def test_the_directory_store_round_trips(names: list[str]) -> None:
    async def scenario(root: Path) -> None:
        store: PayloadStore = DirectoryPayloadStore(root, fsync=True)
        for i, name in enumerate(names):
            await store.put(name, name.encode() * i)
        for i, name in enumerate(dict.fromkeys(reversed(names))):  # the last write wins
            last = len(names) - 1 - names[::-1].index(name)
            assert await store.get(name) == name.encode() * last, i
        await store.delete([*names, "never-written"])
        for name in names:
            with pytest.raises(PayloadMissing):
                await store.get(name)

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(scenario(Path(root)))
        # no temporary file is left behind
        assert not [p for p in Path(root).rglob("*") if p.is_file()]


def test_stores_open_from_urls(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/p?fsync=1")
    assert isinstance(store, DirectoryPayloadStore)
    assert (store.root, store.fsync) == (tmp_path / "p", True)
    s3 = open_store("s3://bucket/some/prefix?endpoint_url=http://127.0.0.1:1&region=eu-west-1")
    assert (s3.bucket, s3.prefix) == ("bucket", "some/prefix/")  # type: ignore[attr-defined]
    assert s3.client.meta.endpoint_url == "http://127.0.0.1:1"  # type: ignore[attr-defined]
    for bad in ["ftp://x", "file://elsewhere/p", "s3:///prefix"]:
        with pytest.raises(ValueError):
            open_store(bad)


def test_a_reference_is_never_decoded_as_the_result_it_stands_for() -> None:
    async def task() -> dict[str, object]:
        return {}

    codec = ArgsCodec(task)
    ref = encode_ref(PayloadRef("j.result.1", 10, "a" * 64))
    with pytest.raises(PayloadTooLarge, match="its reader fetches it first"):
        codec.decode_result(ref)
    # a value merely shaped like one (no payload store in use) is a value
    assert codec.decode_result(b'{"$fl_ref":"x"}') == {"$fl_ref": "x"}
