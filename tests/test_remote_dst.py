"""``s3://`` destinations against moto's S3 server on 127.0.0.1.

What lands in the bucket must be byte for byte what a local ``normalize``
writes; a refusal or a fault (the bucket missing, access denied, a part
failing with 5xx, a reset connection, a part rejected, what the server
stored differing, Ctrl-C between parts) is one line naming the destination,
exit 2 (130), and leaves no object, no staging object and no open
multipart upload. Faults are injected between parts with botocore's
``before-send`` hook on ckptport's own client: the request never reaches
moto, and the client sees the answer a failing server would give.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ckptport.remote import parts, upload

BUCKET = "dst"
MiB = 1 << 20


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    from fixtures.servers import moto_environment

    with moto_environment():
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DDP-wrapped checkpoint of 12 MiB: three 5 MiB parts once normalized."""
    g = torch.Generator().manual_seed(3)
    state = {f"module.layer{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(3)}
    state["module.layer0.bias"] = torch.randn(1024, generator=g).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("dst_src") / "ddp.pth"
    torch.save({"state_dict": state, "epoch": 2}, path)
    return path


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upload, "PART_SIZE", upload.MIN_PART)


@pytest.fixture
def bucket(s3: Any) -> Iterator[Any]:
    """The bucket, emptied after each test (objects and open uploads)."""
    yield s3
    for obj in s3.list_objects_v2(Bucket=BUCKET).get("Contents", ()):
        s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    for up in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", ()):
        s3.abort_multipart_upload(Bucket=BUCKET, Key=up["Key"], UploadId=up["UploadId"])


def _keys(client: Any) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", ()))


def _nothing_left(client: Any, keep: tuple[str, ...] = ()) -> None:
    assert _keys(client) == sorted(keep)
    assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def _get(client: Any, key: str) -> bytes:
    body: bytes = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return body


@pytest.mark.parametrize("name", ["model.safetensors", "model.pth"])
def test_file_lands_as_local_normalize_writes_it(bucket, source, run, tmp_path, name):
    local = run("normalize", source, tmp_path / name, "-q")
    assert local.exit_code == 0, local.stderr
    result = run("normalize", source, f"s3://{BUCKET}/clean/{name}", "-q", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert _get(bucket, f"clean/{name}") == (tmp_path / name).read_bytes()
    _nothing_left(bucket, keep=(f"clean/{name}",))
    report = json.loads(result.stdout)
    assert report["output"]["path"] == f"s3://{BUCKET}/clean/{name}"
    again = run("normalize", source, f"s3://{BUCKET}/clean/{name}", "-q")
    assert again.exit_code == 2
    assert again.stderr.strip() == (f"ckptport: error: s3://{BUCKET}/clean/{name}: exists; "
                                    "pass --overwrite to replace it")
    assert run("normalize", source, f"s3://{BUCKET}/clean/{name}", "-q",
               "--overwrite").exit_code == 0


def test_shard_set_lands_index_last_and_replaces_stale_shards(bucket, source, run, tmp_path):
    assert run("normalize", source, tmp_path / "set", "--max-shard-size", "5MB",
               "-q").exit_code == 0
    dst = f"s3://{BUCKET}/set/"
    result = run("normalize", source, dst, "--max-shard-size", "5MB", "-q")
    assert result.exit_code == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "set").iterdir())
    assert len(names) == 4  # three shards and the index
    assert _keys(bucket) == [f"set/{n}" for n in names]
    for n in names:
        assert _get(bucket, f"set/{n}") == (tmp_path / "set" / n).read_bytes()
    refused = run("normalize", source, dst, "--max-shard-size", "5MB", "-q")
    assert refused.exit_code == 2
    assert "already holds model-00001-of-00003.safetensors" in refused.stderr
    assert run("normalize", source, dst, "--max-shard-size", "1GB", "-q",
               "--overwrite").exit_code == 0
    assert _keys(bucket) == ["set/model.safetensors"]  # the stale shards and index are gone


def test_remote_source_to_remote_destination(bucket, source, run, tmp_path):
    assert run("normalize", source, f"s3://{BUCKET}/a/model.safetensors", "-q").exit_code == 0
    result = run("normalize", f"s3://{BUCKET}/a/model.safetensors",
                 f"s3://{BUCKET}/b/model.pth", "-q")
    assert result.exit_code == 0, result.stderr
    (tmp_path / "b.pth").write_bytes(_get(bucket, "b/model.pth"))
    back = torch.load(tmp_path / "b.pth", weights_only=True)
    expected = torch.load(source, weights_only=True)["state_dict"]
    assert list(back) == [k.removeprefix("module.") for k in expected]
    assert all(torch.equal(back[k.removeprefix("module.")], v) for k, v in expected.items())
    same = run("normalize", f"s3://{BUCKET}/a/model.safetensors",
               f"s3://{BUCKET}/a/model.safetensors", "-q", "--overwrite")
    assert same.exit_code == 2 and "is the source" in same.stderr


@pytest.mark.parametrize("connections", [8, 1])
def test_remote_to_remote_set_keeps_a_window_of_the_source(bucket, source, run, tmp_path,
                                                            monkeypatch, connections):
    """A remote shard set from a remote source: the source's spool holds at most the
    latest ``KEPT_BEHIND`` bytes behind the reader and the prefetch's window ahead of it,
    in memory (the oldest ranges are dropped and fetched again when read again); the set
    is the local conversion's, bit for bit. The window is two ranges per connection, and
    two read-ahead requests at least (one connection: 2 x 16 MiB, not 2 x 8)."""
    from ckptport.remote import objects
    from ckptport.remote.s3 import AHEAD, LEAST

    window = max(2 * connections * max(objects.AHEAD_PIECE, LEAST), 2 * AHEAD)
    assert window == {8: 128 << 20, 1: 32 << 20}[connections]

    assert run("normalize", source, f"s3://{BUCKET}/a/model.pth", "-q").exit_code == 0
    most = [0]
    kept = objects.Spool.keep

    def counting(self: Any, start: int, data: memoryview) -> None:
        kept(self, start, data)
        most[0] = max(most[0], self._held)
        assert self.limit == behind + window and self._held <= self.limit
        assert self.file is None  # nothing of the source on local disk

    behind = 1 << 20
    monkeypatch.setattr(objects.Spool, "keep", counting)
    monkeypatch.setattr("ckptport.commands.normalize.file.KEPT_BEHIND", behind)
    result = run("--connections", connections, "normalize", f"s3://{BUCKET}/a/model.pth",
                 f"s3://{BUCKET}/set/", "--max-shard-size", "5MB", "-q")
    assert result.exit_code == 0, result.stderr
    assert 0 < most[0] <= behind + window
    (tmp_path / "model.pth").write_bytes(_get(bucket, "a/model.pth"))
    assert run("normalize", tmp_path / "model.pth", tmp_path / "set", "--max-shard-size", "5MB",
               "-q").exit_code == 0
    for path in (tmp_path / "set").iterdir():
        assert _get(bucket, f"set/{path.name}") == path.read_bytes()


def _fetched_from(monkeypatch: pytest.MonkeyPatch, key: str) -> list[int]:
    """Bytes fetched from the object ``key`` by the command's reads (a counter)."""
    from ckptport.remote import s3

    fetched, fetch = [0], s3.S3Object.fetch_into

    def counting(self: Any, offset: int, buffer: memoryview) -> None:
        if self.key == key:
            fetched[0] += len(buffer)
        fetch(self, offset, buffer)

    monkeypatch.setattr(s3.S3Object, "fetch_into", counting)
    return fetched


def test_remote_to_remote_set_reads_the_source_once(bucket, source, run, tmp_path,
                                                    monkeypatch):
    """Each shard's header holds the source's sha256, known only once the whole source is
    read: its part is sent last, so the source is fetched once (not once more to hash it
    before the first shard can go), and the set is the local conversion's, bit for bit."""
    bucket.put_object(Bucket=BUCKET, Key="once/ddp.pth", Body=source.read_bytes())
    fetched = _fetched_from(monkeypatch, "once/ddp.pth")
    result = run("normalize", f"s3://{BUCKET}/once/ddp.pth", f"s3://{BUCKET}/set/",
                 "--max-shard-size", "5MB", "-q")
    assert result.exit_code == 0, result.stderr
    assert source.stat().st_size <= fetched[0] <= source.stat().st_size + (64 << 10)
    (tmp_path / "ddp.pth").write_bytes(source.read_bytes())
    assert run("normalize", tmp_path / "ddp.pth", tmp_path / "set", "--max-shard-size", "5MB",
               "-q").exit_code == 0
    names = sorted(p.name for p in (tmp_path / "set").iterdir())
    assert len(names) == 4  # three shards and the index
    for name in names:
        assert _get(bucket, f"set/{name}") == (tmp_path / "set" / name).read_bytes()
    with safe_open(str(tmp_path / "set" / names[0]), "pt") as f:
        assert f.metadata()["ckptport.source_sha256"] == hashlib.sha256(
            source.read_bytes()).hexdigest()


@pytest.fixture
def small_window(monkeypatch: pytest.MonkeyPatch) -> int:
    """The source's spool bounded to 3 MiB with one connection (a quarter of ``source``):
    a verification that read the source again would fetch it again."""
    from ckptport.remote import objects, s3

    monkeypatch.setattr(s3, "LEAST", 1 << 20)
    monkeypatch.setattr(s3, "AHEAD", 1 << 20)
    monkeypatch.setattr(objects, "AHEAD_PIECE", 1 << 20)
    monkeypatch.setattr("ckptport.commands.normalize.file.KEPT_BEHIND", 1 << 20)
    return 3 << 20


def test_remote_to_remote_is_verified_by_the_bytes_streamed(bucket, source, run, tmp_path,
                                                            monkeypatch, small_window):
    """The source's spool holds a window much smaller than a shard, and the source is still
    fetched once: each tensor read back from the written shard is compared with the CRC-32
    of the bytes streamed into it, not with the source fetched again."""
    bucket.put_object(Bucket=BUCKET, Key="crc/ddp.pth", Body=source.read_bytes())
    fetched = _fetched_from(monkeypatch, "crc/ddp.pth")
    result = run("--connections", "1", "normalize", f"s3://{BUCKET}/crc/ddp.pth",
                 f"s3://{BUCKET}/set/", "--max-shard-size", "5MB", "-q")
    assert result.exit_code == 0, result.stderr
    assert source.stat().st_size <= fetched[0] <= source.stat().st_size + (64 << 10)
    assert source.stat().st_size > 3 * small_window
    (tmp_path / "ddp.pth").write_bytes(source.read_bytes())
    assert run("normalize", tmp_path / "ddp.pth", tmp_path / "set", "--max-shard-size", "5MB",
               "-q").exit_code == 0
    names = sorted(p.name for p in (tmp_path / "set").iterdir())
    assert _keys(bucket) == ["crc/ddp.pth", *(f"set/{n}" for n in names)]
    for name in names:
        assert _get(bucket, f"set/{name}") == (tmp_path / "set" / name).read_bytes()


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "not-kept"])
def test_a_source_read_out_of_its_order_is_fetched_once(bucket, run, tmp_path, monkeypatch,
                                                        small_window, kept):
    """A ``.safetensors`` file ckptport wrote lays its tensors out by name (``layer10``
    before ``layer2``) and records the state dict's own order, which its readers restore:
    shards grouped in that order read the source out of its order, ahead of its sha256.
    The read-ahead follows the order the writer reads in (``expect``), and what was read
    ahead of the hash is kept until it gets there: the source is fetched once through a
    window of a quarter of it (the sniff's first and last bytes aside); without that
    keeping, what was read ahead is fetched again to finish the hash."""
    from ckptport.readers import open_checkpoint
    from ckptport.remote import readhash
    from ckptport.tree import iter_tensors

    g = torch.Generator().manual_seed(5)
    state = {f"layer{i}.weight": torch.randn(1024, 256, generator=g) for i in range(12)}
    torch.save(state, tmp_path / "ordered.pth")
    path = tmp_path / "named.safetensors"
    assert run("normalize", tmp_path / "ordered.pth", path, "-q").exit_code == 0
    offsets = [leaf.storage.blob.offset for _, leaf in iter_tensors(open_checkpoint(path).tree)]
    assert offsets != sorted(offsets)  # the tree's order is not the file's
    bucket.put_object(Bucket=BUCKET, Key="named/named.safetensors", Body=path.read_bytes())
    if not kept:
        monkeypatch.setattr(readhash, "PENDING", 0)
    fetched = _fetched_from(monkeypatch, "named/named.safetensors")
    result = run("--connections", "1", "normalize", f"s3://{BUCKET}/named/named.safetensors",
                 f"s3://{BUCKET}/set/", "--max-shard-size", "5MB", "-q")
    assert result.exit_code == 0, result.stderr
    size = path.stat().st_size
    assert size > 3 * small_window
    if kept:
        assert size <= fetched[0] <= size + (128 << 10)
    else:
        assert fetched[0] > size + (2 << 20)
    assert run("normalize", path, tmp_path / "set", "--max-shard-size", "5MB",
               "-q").exit_code == 0
    names = sorted(p.name for p in (tmp_path / "set").iterdir())
    assert len(names) == 4
    for name in names:
        assert _get(bucket, f"set/{name}") == (tmp_path / "set" / name).read_bytes()


def test_a_byte_written_wrong_is_caught_by_the_bytes_streamed(bucket, source, run, monkeypatch,
                                                              small_window):
    """A shard that reads back one bit off what was streamed into it fails verification:
    exit 2 naming the tensor, nothing in the bucket but the source."""
    import os

    from ckptport.writers import safetensors as writer

    write = writer.write_safetensors

    def flip_one_byte(plan, file, advance, tap=None, defer=None):
        write(plan, file, advance, tap, defer)
        name = next(iter(plan.entries))
        at = len(plan.header) + plan.entries[name].start + 3
        file.flush()
        (byte,) = os.pread(file.fileno(), 1, at)
        os.pwrite(file.fileno(), bytes([byte ^ 1]), at)

    bucket.put_object(Bucket=BUCKET, Key="crc/ddp.pth", Body=source.read_bytes())
    monkeypatch.setattr(writer, "write_safetensors", flip_one_byte)
    result = run("--connections", "1", "normalize", f"s3://{BUCKET}/crc/ddp.pth",
                 f"s3://{BUCKET}/set/", "--max-shard-size", "5MB", "-q")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"ckptport: error: s3://{BUCKET}/set/model-00001-of-00003."
                                    "safetensors: written file reads back different: ")
    assert result.stderr.rstrip().endswith("tensor bytes differ from the bytes written (CRC-32)")
    _nothing_left(bucket, keep=("crc/ddp.pth",))


def test_a_record_verified_by_its_crc_is_still_placed_by_zipfile(source):
    """What the fresh read proved besides the bytes: a zip record read where Python's
    zipfile does not place it is refused (torch and zipfile would disagree on it)."""
    from dataclasses import replace

    from ckptport.dtypes import dtype_of
    from ckptport.errors import InputError
    from ckptport.readers import open_checkpoint
    from ckptport.tensors import Pending, TensorInfo
    from ckptport.tree import iter_tensors
    from ckptport.writers.verify import Independent

    leaves = [leaf for _, leaf in iter_tensors(open_checkpoint(source).tree)]
    assert leaves and all(isinstance(leaf, TensorInfo) for leaf in leaves)
    with Independent() as independent:
        for leaf in leaves:
            independent.placed(leaf)  # where zipfile places it
        blob = leaves[0].storage.blob
        moved = replace(leaves[0], storage=replace(leaves[0].storage, blob=replace(
            blob, offset=blob.offset + 64)))
        for misplaced in (moved, Pending(moved, dtype_of(torch.float16))):
            with pytest.raises(InputError, match="Python's zipfile places it at byte"):
                independent.placed(misplaced)


def test_a_first_part_sent_last_that_fails_leaves_nothing(bucket, source, run):
    """The parts holding the shards' headers go at the commit, after the index and every
    other part: one refused then aborts every upload, and nothing appears."""
    from ckptport.remote.deadline import Timeout
    from ckptport.remote.s3 import client

    sent: list[tuple[str, int]] = []

    def noted(params: Any, **kwargs: Any) -> None:
        sent.append((params["Key"], int(params["PartNumber"])))

    events = client(Timeout.from_env()).meta.events
    events.register("provide-client-params.s3.UploadPart", noted)
    try:
        made = run("normalize", source, f"s3://{BUCKET}/ok/", "--max-shard-size", "5MB", "-q")
    finally:
        events.unregister("provide-client-params.s3.UploadPart", noted)
    assert made.exit_code == 0, made.stderr
    index = next(i for i, (key, _) in enumerate(sent) if ".index.json" in key)
    firsts = [i for i, (key, n) in enumerate(sent) if n == 1 and ".index.json" not in key]
    assert len(firsts) == 3 and min(firsts) > index
    assert len(sent) == 4  # each shard one part, sent last; the index
    for key in _keys(bucket):
        bucket.delete_object(Bucket=BUCKET, Key=key)
    remove = _inject("UploadPart", lambda: _response(500, "InternalError"),
                     after=len(sent) - 1)
    try:
        refused = run("normalize", source, f"s3://{BUCKET}/late/", "--max-shard-size", "5MB",
                      "-q")
    finally:
        remove()
    assert refused.exit_code == 2 and "InternalError" in refused.stderr
    _nothing_left(bucket)


def test_a_bounded_spool_drops_the_oldest_and_never_reads_a_hole():
    from ckptport.remote.objects import Spool

    spool = Spool(limit=10)
    data = bytes(range(24))
    for start in (0, 8, 16):
        spool.claim(start, start + 8)
        spool.keep(start, memoryview(data[start:start + 8]))
        spool.release([(start, start + 8)])
    assert spool.missing(0, 24) == [(0, 16)]  # two dropped to keep 8 <= 10 bytes
    buffer = memoryview(bytearray(24))
    lost = spool.read_held(0, buffer, [])
    assert lost == [(0, 16)] and bytes(buffer[16:]) == data[16:]
    spool.close()


def test_parts_keep_every_connection_busy_in_few_requests(monkeypatch):
    """A part per connection (each one request to send, copy and complete), of 16 to 64
    MiB, and never more than S3's 10,000 parts."""
    mib = 1 << 20
    monkeypatch.setattr(upload, "PART_SIZE", 16 * mib)  # the default, not this file's 5 MiB
    assert upload.part_size(243_537_760, 8) == 30 * mib       # 8 parts of a 250 MB shard
    assert upload.part_size(10 * mib, 8) == 16 * mib          # one part: the least part
    assert upload.part_size(5 << 30, 8) == 64 * mib           # 80 parts, the largest
    huge = 1 << 40
    assert -(-huge // upload.part_size(huge, 8)) <= upload.MAX_PARTS
    assert upload.part_size(243_537_760, 1) == 64 * mib


@pytest.mark.parametrize(("args", "message"), [
    (("s3://missing-bucket/x.pth",), "s3://missing-bucket/x.pth: no such bucket 'missing-bucket'"),
    ((f"s3://{BUCKET}/x.unknown",), "cannot tell the output format"),
    ((f"s3://{BUCKET}/x.pth", "--max-shard-size", "1GB"), "a shard set is a folder"),
    ((f"s3://{BUCKET}/x/", "--to", "dcp"), "written to a local folder only"),
    ((f"s3://{BUCKET}/x.pth", "--hash-name"), "--hash-name names a local file"),
], ids=["no-bucket", "extension", "set-needs-folder", "dcp", "hash-name"])
def test_refusals_before_anything_is_read(bucket, source, run, args, message):
    result = run("normalize", source, *args, "-q")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    _nothing_left(bucket)


def _response(status: int, code: str) -> Any:
    from botocore.awsrequest import AWSResponse

    body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
            f"<Message>injected</Message></Error>").encode()

    class Raw:
        def stream(self, **kwargs: Any) -> Iterator[bytes]:
            yield body

    return AWSResponse("http://injected", status, {"Content-Type": "application/xml"}, Raw())


def _inject(operation: str, fault: Callable[[], Any], after: int = 1,
            times: int = -1) -> Callable[[], None]:
    """Answer ``operation`` with ``fault()`` from its ``after``+1-th request on, ``times``
    times (-1: always); returns the function that removes the hook."""
    from ckptport.remote.deadline import Timeout
    from ckptport.remote.s3 import client

    seen = [0, times]

    def hook(request: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] <= after or seen[1] == 0:
            return None
        seen[1] -= 1
        return fault()

    events = client(Timeout.from_env()).meta.events
    events.register(f"before-send.s3.{operation}", hook)
    return lambda: events.unregister(f"before-send.s3.{operation}", hook)


def _reset() -> Any:
    raise ConnectionResetError(104, "Connection reset by peer")


FAULTS = [
    ("UploadPart", lambda: _response(500, "InternalError"), "InternalError"),
    ("UploadPart", _reset, "S3 error"),
    ("UploadPart", lambda: _response(400, "BadDigest"), "BadDigest"),
    ("CreateMultipartUpload", lambda: _response(403, "AccessDenied"), "access denied"),
    ("UploadPartCopy", lambda: _response(503, "ServiceUnavailable"), "ServiceUnavailable"),
]


@pytest.mark.parametrize(("operation", "fault", "message"), FAULTS,
                         ids=[f"{o}-{m}" for o, _, m in FAULTS])
def test_a_failing_server_leaves_nothing(bucket, source, run, operation, fault, message):
    dst = f"s3://{BUCKET}/out/model.safetensors"
    remove = _inject(operation, fault, after=1 if operation == "UploadPart" else 0)
    try:
        result = run("normalize", source, dst, "-q")
    finally:
        remove()
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line.startswith(f"ckptport: error: {dst}: ") and "\n" not in line, line
    assert message in line and "testingsecret" not in line
    _nothing_left(bucket)


def test_a_store_without_conditional_writes(bucket, source, run, tmp_path):
    """A store that answers IfNoneMatch with 501 NotImplemented still gets the object (after a
    HEAD says there is none), and still refuses to replace one that appeared."""
    from ckptport.remote.deadline import Timeout
    from ckptport.remote.s3 import client

    def refuse(request: Any, **kwargs: Any) -> Any:
        if request.headers.get("If-None-Match"):
            return _response(501, "NotImplemented")
        return None

    events = client(Timeout.from_env()).meta.events
    events.register("before-send.s3.CompleteMultipartUpload", refuse)
    try:
        result = run("normalize", source, f"s3://{BUCKET}/plain.safetensors", "-q")
    finally:
        events.unregister("before-send.s3.CompleteMultipartUpload", refuse)
    assert result.exit_code == 0, result.stderr
    assert run("normalize", source, tmp_path / "plain.safetensors", "-q").exit_code == 0
    assert _get(bucket, "plain.safetensors") == (tmp_path / "plain.safetensors").read_bytes()
    _nothing_left(bucket, keep=("plain.safetensors",))


def test_one_failing_part_is_retried(bucket, source, run, tmp_path):
    remove = _inject("UploadPart", lambda: _response(500, "InternalError"), after=1, times=1)
    try:
        result = run("normalize", source, f"s3://{BUCKET}/ok.safetensors", "-q")
    finally:
        remove()
    assert result.exit_code == 0, result.stderr
    assert run("normalize", source, tmp_path / "ok.safetensors", "-q").exit_code == 0
    assert _get(bucket, "ok.safetensors") == (tmp_path / "ok.safetensors").read_bytes()
    _nothing_left(bucket, keep=("ok.safetensors",))


def test_what_the_server_stored_is_verified(bucket, source, run):
    """The staged object is replaced behind ckptport's back: the read-back refuses it."""
    from ckptport.remote.deadline import Timeout
    from ckptport.remote.s3 import client

    def swap(parsed: Any, **kwargs: Any) -> None:
        key = parsed["Key"]
        if key.endswith(upload.TEMP_SUFFIX):
            size = bucket.head_object(Bucket=BUCKET, Key=key)["ContentLength"]
            bucket.put_object(Bucket=BUCKET, Key=key, Body=b"\0" * size)

    events = client(Timeout.from_env()).meta.events
    events.register("after-call.s3.CompleteMultipartUpload", swap)
    try:
        result = run("normalize", source, f"s3://{BUCKET}/swapped.pth", "-q")
    finally:
        events.unregister("after-call.s3.CompleteMultipartUpload", swap)
    assert result.exit_code == 2
    assert f"s3://{BUCKET}/swapped.pth: S3 holds" in result.stderr
    _nothing_left(bucket)


def test_read_back_streams_blocks_resumes_a_break_and_compares_every_block(
        bucket, source, run, monkeypatch):
    """The read-back is a few streamed requests (one span per connection), compared block by
    block; a body that breaks mid-span is asked again from that block; bytes that read back
    different from those sent are refused naming the part, and nothing appears."""
    from ckptport.remote import s3

    monkeypatch.setattr(parts, "READ_BACK", MiB)
    body = s3.S3Object._body
    calls = {"blocks": 0, "broke": 0}

    def breaking(self: Any, stream: Any, buffer: memoryview, late: Any, last: bool) -> int:
        calls["blocks"] += 1
        if calls["blocks"] == 3 and not calls["broke"]:
            calls["broke"] += 1
            raise s3.Transient("the connection broke (injected)")
        return body(self, stream, buffer, late, last)

    monkeypatch.setattr(s3.S3Object, "_body", breaking)
    made = run("normalize", source, f"s3://{BUCKET}/streamed.pth", "-q", "--format", "json")
    assert made.exit_code == 0, made.stderr
    assert calls["broke"] == 1 and calls["blocks"] >= 13  # 12 MiB in 1 MiB blocks, one again
    seen = [0]

    def lying(self: Any, stream: Any, buffer: memoryview, late: Any, last: bool) -> int:
        got = body(self, stream, buffer, late, last)
        seen[0] += 1
        if seen[0] == 5:  # the server hands back one block with a bit flipped
            buffer[0] ^= 1
        return got

    monkeypatch.setattr(s3.S3Object, "_body", lying)
    refused = run("normalize", source, f"s3://{BUCKET}/differs.pth", "-q")
    assert refused.exit_code == 2 and "reads back different in bytes" in refused.stderr
    _nothing_left(bucket, keep=("streamed.pth",))


def test_ctrl_c_between_parts_aborts_the_upload(bucket, source, run):
    def interrupt() -> Any:
        raise KeyboardInterrupt

    remove = _inject("UploadPart", interrupt, after=1)
    try:
        result = run("normalize", source, f"s3://{BUCKET}/int.safetensors", "-q")
    finally:
        remove()
    assert result.exit_code == 130
    _nothing_left(bucket)


def test_safetensors_source_metadata_survives_upload(bucket, run, tmp_path):
    path = tmp_path / "small.safetensors"
    save_file({"w": torch.ones(3)}, path, metadata={"note": "kept"})
    result = run("normalize", path, f"s3://{BUCKET}/small.safetensors", "-q")
    assert result.exit_code == 0, result.stderr
    assert run("normalize", path, tmp_path / "local.safetensors", "-q").exit_code == 0
    assert _get(bucket, "small.safetensors") == (tmp_path / "local.safetensors").read_bytes()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of three small checkpoints in two folders."""
    root = tmp_path_factory.mktemp("dst_zoo")
    for i, rel in enumerate(("a/one.pth", "a/two.pth", "b/three.safetensors")):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"module.w": torch.full((4, 4), float(i))}
        if path.suffix == ".pth":
            torch.save({"state_dict": state}, path)
        else:
            save_file(state, path)
    return root


def _folder(run: Callable[..., Any], *args: Any) -> dict[str, Any]:
    result = run("normalize", *args, "--format", "json", "-q", "--jobs", "1")
    assert result.exit_code == 0, result.stderr
    made: dict[str, Any] = json.loads(result.stdout)
    return made


def test_folder_mode_into_a_bucket_resumes_and_splits(bucket, zoo, run, tmp_path):
    dst = f"s3://{BUCKET}/zoo/"
    outputs = ["zoo/a/one.safetensors", "zoo/a/two.safetensors", "zoo/b/three.safetensors"]
    first = _folder(run, zoo, dst, "--to", "safetensors")
    assert first["counts"]["converted"] == 3
    assert [k for k in _keys(bucket) if "/.ckptport-journal/" not in k] == outputs
    assert not bucket.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    local = _folder(run, zoo, tmp_path / "zoo", "--to", "safetensors")
    assert local["counts"]["converted"] == 3
    for key in outputs:
        assert _get(bucket, key) == (tmp_path / key).read_bytes()
    assert _folder(run, zoo, dst, "--to", "safetensors")["counts"]["skipped"] == 3
    bucket.delete_object(Bucket=BUCKET, Key="zoo/a/two.safetensors")
    again = _folder(run, zoo, dst, "--to", "safetensors")
    assert (again["counts"]["converted"], again["counts"]["skipped"]) == (1, 2)
    parts = [_folder(run, zoo, f"s3://{BUCKET}/split/", "--to", "safetensors", "--part", p)
             for p in ("1/2", "2/2")]
    assert sum(p["counts"]["converted"] for p in parts) == 3
    assert len([k for k in _keys(bucket) if k.startswith("split/")
                and "/.ckptport-journal/" not in k]) == 3
    missing = run("normalize", zoo, "s3://missing-bucket/zoo/", "-q")
    assert missing.exit_code == 2 and "no such bucket" in missing.stderr


def _upload_zoo(client: Any, zoo: Path, prefix: str) -> list[str]:
    names = sorted(p.relative_to(zoo).as_posix() for p in zoo.rglob("*") if p.is_file())
    for name in names:
        client.upload_file(str(zoo / name), BUCKET, prefix + name)
    return names


def test_check_searches_a_bucket_folder_as_a_local_one(bucket, zoo, run):
    """``check s3://…/zoo/`` checks each checkpoint below it, as ``check zoo/`` does (it said
    the folder held no checkpoint: a bucket folder was never searched); ``inspect`` of it
    lists what it holds, as for a local folder."""
    _upload_zoo(bucket, zoo, "zoo/")

    def findings(target: str, root: str) -> list[tuple[str, str, str]]:
        result = run("check", target, "--format", "json")
        assert result.exit_code == 1, result.output  # CKP004 warnings, no error
        return sorted((file["path"].removeprefix(root), f["code"], f["key"])
                      for file in json.loads(result.stdout)["files"] for f in file["findings"])

    local = findings(str(zoo), f"{zoo}/")
    assert local == findings(f"s3://{BUCKET}/zoo/", f"s3://{BUCKET}/zoo/")
    assert [path for path, _, _ in local] == ["a/one.pth", "a/two.pth", "b/three.safetensors"]
    inspected = run("inspect", f"s3://{BUCKET}/zoo/")  # one checkpoint's command: says which
    assert inspected.exit_code == 2 and "it holds a/, b/ (2 entries)" in inspected.stderr
    assert "check and normalize also take a folder of checkpoints whole" in inspected.stderr


def test_folder_mode_from_a_bucket_folder_resumes_splits_and_pins(bucket, zoo, run, tmp_path):
    """``normalize s3://…/zoo/ s3://…/clean/`` (and into a local folder) as local folder mode:
    the same outputs, resumed after an interrupted run, split by ``--part``; a source that
    changes after it was listed is refused by name, the others converted. The empty objects
    a console's "Create folder" leaves (``zoo/a/``) are folders, as a local walk sees them."""
    from ckptport.commands.normalize import FolderOptions, normalize_folder

    _upload_zoo(bucket, zoo, "zoo/")
    for marker in ("zoo/", "zoo/a/", "zoo/empty/"):
        bucket.put_object(Bucket=BUCKET, Key=marker, Body=b"")
    local = _folder(run, zoo, tmp_path / "local", "--to", "safetensors")
    assert local["counts"]["converted"] == 3
    here = _folder(run, f"s3://{BUCKET}/zoo/", tmp_path / "here", "--to", "safetensors")
    assert here["counts"]["converted"] == 3 and here["not_checkpoints"] == []
    for f in local["files"]:
        made = (tmp_path / "here" / f["output"]).read_bytes()
        assert made == (tmp_path / "local" / f["output"]).read_bytes()

    def stop_after_one(name: str, total: int) -> Callable[[int], None]:
        def advance(n: int) -> None:
            if name == "files":
                raise KeyboardInterrupt
        return advance

    settings = FolderOptions(to="safetensors", jobs=1)
    with pytest.raises(KeyboardInterrupt, match="1 files converted and kept"):
        normalize_folder(f"s3://{BUCKET}/zoo/", f"s3://{BUCKET}/clean/", settings,
                         progress=stop_after_one)
    resumed = _folder(run, f"s3://{BUCKET}/zoo/", f"s3://{BUCKET}/clean/", "--to",
                      "safetensors")
    assert (resumed["counts"]["converted"], resumed["counts"]["skipped"]) == (2, 1)
    for f in local["files"]:
        assert _get(bucket, "clean/" + f["output"]) == (tmp_path / "local" / f["output"]
                                                        ).read_bytes()
    again = _folder(run, f"s3://{BUCKET}/zoo/", f"s3://{BUCKET}/clean/", "--to", "safetensors")
    assert again["counts"]["skipped"] == 3  # listed, HEADs only: nothing fetched again
    parts = [_folder(run, f"s3://{BUCKET}/zoo/", f"s3://{BUCKET}/split/", "--to",
                     "safetensors", "--part", p) for p in ("1/2", "2/2")]
    assert sorted(f["source"] for p in parts for f in p["files"]) == \
        ["a/one.pth", "a/two.pth", "b/three.safetensors"]

    def rewrite_after_one(name: str, total: int) -> Callable[[int], None]:
        def advance(n: int) -> None:  # the biggest file is done: rewrite another
            if name == "files":
                bucket.put_object(Bucket=BUCKET, Key="zoo/b/three.safetensors", Body=b"x" * 99)
        return advance

    changed = normalize_folder(f"s3://{BUCKET}/zoo/", tmp_path / "changed",
                               FolderOptions(to="safetensors", jobs=1),
                               progress=rewrite_after_one)
    failed = [f for f in changed.files if f.status == "failed"]
    assert changed.exit_code == 1 and [f.source for f in failed] == ["b/three.safetensors"]
    assert "changed while it was read" in failed[0].reason
    assert not list((tmp_path / "changed" / "b").iterdir())  # nothing written for it
    inside = run("normalize", f"s3://{BUCKET}/zoo/", f"s3://{BUCKET}/zoo/out/", "-q")
    assert inside.exit_code == 2 and "lie inside one another" in inside.stderr


def _cached_clients() -> int:
    from ckptport.remote import s3

    return s3._client.cache_info().currsize


def test_a_forked_worker_makes_its_own_s3_client(s3):
    """Folder mode's workers are forked: the parent's boto3 client (and its pooled
    connections) must not be shared with them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ckptport.remote.deadline import Timeout
    from ckptport.remote.s3 import client

    client(Timeout.from_env())
    assert _cached_clients() >= 1
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        assert pool.submit(_cached_clients).result() == 0
