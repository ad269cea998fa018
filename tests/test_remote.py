"""Remote sources against real servers on 127.0.0.1: an HTTP object server, the hub's
routes (``HF_ENDPOINT`` pointing at it) and moto's standalone S3 server.

Every command reads the remote copy and must agree with the local copy:
``inspect`` and ``check`` reports, the manifest, ``diff`` (equal), and
``normalize`` output byte for byte. Transfers are counted by the servers
and by ckptport's report, and bounded: a report reads headers, not tensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptport.errors import InputError
from ckptport.remote import location, meter
from ckptport.remote.urls import parse_url
from fixtures.servers import HubRepo, ObjectServer

TOKEN = "hf_secrettoken123"
REPO = "org/model"
MiB = 1 << 20


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(512, 1024, generator=g),  # 2 MiB
            "layer.weight": torch.randn(1024, 512, generator=g),  # 2 MiB
            "layer.bias": torch.randn(512, generator=g).to(torch.bfloat16),
            "steps": torch.arange(7)}


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory, fx: dict[str, Path]) -> dict[str, Path]:
    """The local copies: a safetensors file, a torch zip, a shard set, a malicious pickle."""
    out = tmp_path_factory.mktemp("remote_local")
    state = _state(0)
    save_file(state, out / "model.safetensors")
    torch.save({"model": state, "epoch": 3}, out / "model.pth")
    shards = out / "shards"
    shards.mkdir()
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[:2], names[2:]), 1):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, shards / name)
        weight_map.update(dict.fromkeys(part, name))
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return {"safetensors": out / "model.safetensors", "pth": out / "model.pth",
            "shards": shards, "malicious": fx["malicious_zip"]}


@pytest.fixture(scope="session")
def server(local: dict[str, Path]) -> Iterator[ObjectServer]:
    made = ObjectServer()
    made.objects.update({"/model.safetensors": local["safetensors"], "/model.pth": local["pth"],
                         "/malicious.pth": local["malicious"]})
    made.objects.update({f"/shards/{p.name}": p for p in local["shards"].iterdir()})
    made.denied.add("/secret.pth")
    made.repos[REPO] = HubRepo({p.name: p for p in local["shards"].iterdir()} |
                               {"single/model.pth": local["pth"]})
    made.token = TOKEN
    yield made
    made.close()


@pytest.fixture
def hub(server: ObjectServer, monkeypatch: pytest.MonkeyPatch) -> ObjectServer:
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return server


@pytest.fixture(scope="session")
def s3(local: dict[str, Path]) -> Iterator[str]:
    """moto's S3 server holding the same files; yields its endpoint."""
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    from fixtures.servers import moto_environment

    with moto_environment() as endpoint:
        client = boto3.client("s3")
        client.create_bucket(Bucket="ckpts")
        for name in ("safetensors", "pth"):
            client.upload_file(str(local[name]), "ckpts", f"run/{local[name].name}")
        for shard in local["shards"].iterdir():
            client.upload_file(str(shard), "ckpts", f"shards/{shard.name}")
        yield endpoint


def _url(kind: str, scheme: str, server: ObjectServer) -> str:
    """The remote spelling of local ``kind`` over ``scheme``."""
    http = {"safetensors": "/model.safetensors", "pth": "/model.pth",
            "shards": "/shards/model.safetensors.index.json"}
    s3 = {"safetensors": "run/model.safetensors", "pth": "run/model.pth",
          "shards": "shards/model.safetensors.index.json"}
    hub = {"pth": "single/model.pth", "shards": ""}
    if scheme == "http":
        return server.url + http[kind]
    if scheme == "s3":
        return f"s3://ckpts/{s3[kind]}"
    return f"hf://{REPO}@main/{hub[kind]}".rstrip("/")


CASES = [("http", "safetensors"), ("http", "pth"), ("http", "shards"), ("s3", "safetensors"),
         ("s3", "pth"), ("s3", "shards"), ("hf", "pth"), ("hf", "shards")]


@pytest.fixture
def remote(request: pytest.FixtureRequest, server: ObjectServer,
           monkeypatch: pytest.MonkeyPatch) -> ObjectServer:
    scheme = request.param
    if scheme == "hf":
        pytest.importorskip("huggingface_hub")
        request.getfixturevalue("hub")
    if scheme == "s3":
        request.getfixturevalue("s3")
    server.reset()
    server.scheme = scheme  # type: ignore[attr-defined]
    return server


def _json(result: object) -> dict:
    return json.loads(result.stdout)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("remote", "kind"), CASES, indirect=["remote"])
def test_every_command_agrees_with_the_local_copy(remote, kind, local, run, tmp_path):
    url, here = _url(kind, remote.scheme, remote), local[kind]
    shown, mine = run("inspect", url, "--format", "json"), run("inspect", here, "--format", "json")
    assert shown.exit_code == 0, shown.stderr
    got, expected = _json(shown), _json(mine)
    assert got["transferred"]["bytes"] > 0 and "transferred" not in expected
    for key in ("format", "tensors", "parameters", "bytes_by_dtype", "tensor_bytes"):
        assert got[key] == expected[key], key

    checked = run("check", url, "--format", "json")
    assert checked.exit_code == _json(run("check", here, "--format", "json"))["exit_code"]
    assert _json(checked)["files"][0]["path"].split("://")[0] == remote.scheme

    made = run("manifest", url)
    assert made.exit_code == 0, made.stderr
    assert made.stdout == run("manifest", here).stdout

    compared = run("diff", url, here, "--format", "json")
    assert compared.exit_code == 0, compared.stdout
    assert _json(compared)["equal"] and _json(compared)["transferred"]["bytes"] > 0

    for ext in ("safetensors", "pth"):
        theirs, ours = tmp_path / f"remote.{ext}", tmp_path / f"local.{ext}"
        written = run("normalize", url, theirs, "--format", "json", "-q")
        assert written.exit_code == 0, written.stderr
        assert run("normalize", here, ours, "-q").exit_code == 0
        assert theirs.read_bytes() == ours.read_bytes()  # source_sha256 included
        assert _json(written)["transferred"]["bytes"] > 0


@pytest.mark.parametrize("remote", ["http", "hf"], indirect=True)
def test_reports_transfer_the_header_not_the_tensors(remote, local, run):
    """A torch zip: its directory, pickle and local headers; a safetensors file: its
    header and the sniff's prefix and tail; no tensor's bytes in either."""
    kinds = ["pth"] if remote.scheme == "hf" else ["pth", "safetensors"]
    for kind in kinds:
        url = _url(kind, remote.scheme, remote)
        remote.reset()
        result = run("inspect", url, "--format", "json")
        assert result.exit_code == 0, result.stderr
        reported = _json(result)["transferred"]["bytes"]
        # the report says what the server sent (the hub: also the revision's JSON, 1 request)
        assert reported <= remote.stats.bytes_sent <= reported + (
            4096 if remote.scheme == "hf" else 0)
        size = local[kind].stat().st_size
        assert size > 4 * MiB
        limit = 256 << 10 if kind == "pth" else (1 << 20) + (80 << 10) + 4096
        assert remote.stats.bytes_sent <= limit, (kind, remote.stats.bytes_sent)


def test_hub_token_goes_to_the_hub_only(hub, run):
    hub.reset()
    made = run("manifest", f"hf://{REPO}")
    assert made.exit_code == 0, made.stderr
    cdn = {p: a for p, a in hub.stats.auth.items() if p.startswith("/cdn/")}
    # (huggingface_hub also fetches /api/agent-harnesses, tokenless, when its cache is stale)
    api = {p: a for p, a in hub.stats.auth.items() if p.startswith("/api/models/")}
    assert cdn and all(a == {""} for a in cdn.values())  # the redirect target saw no token
    assert api and all(a == {f"Bearer {TOKEN}"} for a in api.values())
    assert TOKEN not in made.stdout + made.stderr


def test_a_hub_folder_is_read_by_the_names_a_local_folder_is(hub, local, run, tmp_path):
    """A peft adapter repository holds adapter_model.safetensors, as its local folder does."""
    repo = "org/adapter"
    hub.repos[repo] = HubRepo({"adapter_model.safetensors": local["safetensors"],
                               "adapter_config.json": local["safetensors"]})
    try:
        out = tmp_path / "o.safetensors"
        result = run("normalize", f"hf://{repo}", out, "-q")
        assert result.exit_code == 0, result.stderr
        got, want = load_file(out), load_file(local["safetensors"])
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    finally:
        del hub.repos[repo]


def test_a_folder_in_a_hub_repository_reads_as_its_weights(hub, local, run, tmp_path):
    """``hf://ORG/REPO/FOLDER/`` is that folder's weights (as ``s3://BUCKET/PREFIX/`` is),
    never the repository root's; a shard set of the folder is read from the folder."""
    repo = "org/nested"
    hub.repos[repo] = HubRepo({"sub/model.safetensors": local["safetensors"],
                               "pytorch_model.bin": local["pth"]})
    try:
        here = run("manifest", local["safetensors"]).stdout
        made = run("manifest", f"hf://{repo}/sub/")
        assert made.exit_code == 0, made.stderr
        assert made.stdout == here
        root = run("manifest", f"hf://{repo}")  # the root's own weights
        assert root.exit_code == 0 and root.stdout == run("manifest", local["pth"]).stdout
    finally:
        del hub.repos[repo]


def test_hub_without_token_is_one_line(hub, run, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    result = run("inspect", f"hf://{REPO}/single/model.pth")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and f"hf://{REPO}/single/model.pth" in result.stderr
    assert "hf_wrong" not in result.stderr


@pytest.mark.parametrize(("fault", "count", "message"), [
    ("error_500", 1, None), ("error_429", 1, None), ("drop", 1, None), ("stall", 1, None),
    ("error_500", -1, "HTTP 500"), ("ignore_range", -1, "ignores Range"),
    ("wrong_range", -1, "Content-Range"), ("short_body", -1, "truncated"),
    ("lie_size", -1, "the server sent Content-Range"),
])
def test_http_faults(server, run, tmp_path, monkeypatch, fault, count, message):
    """Transient faults are retried to success; persistent ones are one line, exit 2."""
    monkeypatch.setattr("ckptport.remote.fetching.BACKOFF", 0.01)
    if fault == "stall":  # the answer comes later than the client waits: timed out, retried
        monkeypatch.setenv("CKPTPORT_REMOTE_TIMEOUT", "read=0.5")
    server.reset()
    server.faults[fault] = count
    out = tmp_path / "out.safetensors"
    result = run("normalize", server.url + "/model.pth", out, "-q")
    server.reset()
    if message is None:
        assert result.exit_code == 0, result.stderr
        assert out.exists()
        return
    assert result.exit_code == 2, result.stdout
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{server.url}/model.pth" in result.stderr and message in result.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


# every hostile peer, with a deadline small enough for a test: (fault, timeout, message)
HOSTILE = [
    ("drip_headers", "request=0.5", "no complete answer within 0.5 s"),
    ("drip_body", "request=0.5", "no complete answer within 0.5 s"),
    ("drip_body", "total=0.5,request=30", "total deadline of 0.5 s"),
    ("silent", "request=0.5", "no complete answer within 0.5 s"),  # read=60: one wait, cut
    ("silent", "request=0.5,read=0.1", "no complete answer within 0.5 s"),  # retries count
    ("stall", "request=0.5,read=0.1", "no complete answer within 0.5 s"),
    ("bad_length", "request=30", "in a body of Content-Length '"),  # refused before it
    ("long_length", "request=30", "in a body of 1001 bytes"),  # is read
]


@pytest.mark.parametrize(("fault", "timeout", "message"), HOSTILE)
def test_slow_or_lying_peers_end_on_time(server, run, tmp_path, monkeypatch, fault, timeout,
                                         message):
    """A peer that drips, never answers or lies about a length: one line naming the URL
    and the deadline, exit 2, nothing written; the message says which budget to raise.
    A socket timeout alone (60 s per read) would wait forever on each of these."""
    monkeypatch.setattr("ckptport.remote.fetching.BACKOFF", 0.01)
    server.reset()
    server.faults[fault] = -1
    out = tmp_path / "out.safetensors"
    commands = [("inspect", server.url + "/model.pth")]
    if fault == "drip_body":  # and a command that writes leaves nothing
        commands.append(("normalize", server.url + "/model.pth", out, "-q"))
    for args in commands:
        result = run("--remote-timeout", timeout, *args)
        assert result.exit_code == 2, result.stdout
        assert result.stderr.count("\n") == 1, result.stderr
        assert f"{server.url}/model.pth: " in result.stderr and message in result.stderr
    server.reset()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("fault", "message"), [
    ("bad_length", "asked for 1000 bytes, the server announces 1000x"),
    ("long_length", "asked for 1000 bytes, the server announces 2000"),
])
def test_a_range_length_is_checked_before_its_body_is_read(server, fault, message):
    """After the first request: a range whose Content-Length is not the length asked for
    is refused from its headers (on a kept-alive connection the body would never end)."""
    server.reset()
    file = location(server.url + "/model.pth").opened()
    server.faults[fault] = -1
    try:
        with pytest.raises(InputError, match=message):
            file.read(0, 1000)
    finally:
        server.reset()


@pytest.mark.parametrize("fault", ["drip_headers", "drip_body", "silent"])
def test_s3_peers_end_on_time(server, local, run, monkeypatch, fault):
    """boto3 holds S3's sockets: each call is waited for until the deadline. The object
    server answers S3's path-style HeadObject and ranged GetObject, so it can misbehave
    as an S3 endpoint too (moto cannot be made slow)."""
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "secret"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    server.reset()
    server.objects["/slow-bucket/run/model.pth"] = local["pth"]
    assert run("inspect", "s3://slow-bucket/run/model.pth").exit_code == 0  # a valid read
    server.faults[fault] = -1
    try:
        result = run("--remote-timeout", "request=0.5", "inspect",
                     "s3://slow-bucket/run/model.pth")
    finally:
        server.reset()
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "s3://slow-bucket/run/model.pth: a request got no complete answer within 0.5 s" \
        in result.stderr


def test_a_silent_hub_api_ends_on_time(hub, run):
    """The revision lookup is huggingface_hub's own request: waited for until the deadline."""
    hub.reset()
    hub.faults["silent"] = -1
    try:
        result = run("--remote-timeout", "request=0.5", "inspect", f"hf://{REPO}/single/model.pth")
    finally:
        hub.reset()
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"hf://{REPO}/single/model.pth: " in result.stderr
    assert "no complete answer within 0.5 s" in result.stderr


def test_a_deadline_is_a_timeout_error_in_python(server, monkeypatch):
    import ckptport
    from ckptport.remote import Timeout, Transfers

    server.reset()
    server.faults["drip_headers"] = -1
    try:
        url = location(server.url + "/model.pth", Transfers(Timeout(request=0.5)))
        with pytest.raises(TimeoutError, match="within 0.5 s") as caught:
            ckptport.read(url)
        assert isinstance(caught.value, ckptport.CkptportError)
    finally:
        server.reset()


def test_the_defaults_let_valid_transfers_finish(server, local, run, tmp_path, monkeypatch):
    """A slow but steady peer (one byte per DRIP_SECONDS is far below any default) is
    not what the defaults refuse: a valid object under the default deadlines is read."""
    from ckptport.remote import Timeout

    assert Timeout() == Timeout.parse("") == Timeout(connect=30, read=60, request=300,
                                                     total=3600)
    monkeypatch.setenv("CKPTPORT_REMOTE_TIMEOUT", "")
    server.reset()
    out = tmp_path / "o.safetensors"
    result = run("normalize", server.url + "/model.pth", out, "-q")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(("spec", "want"), [
    ("900", {"total": 900}), ("total=7200,request=600", {"total": 7200, "request": 600}),
    (" read = 5 , connect=2 ", {"read": 5, "connect": 2}),
])
def test_remote_timeout_spec(spec, want):
    from dataclasses import replace

    from ckptport.remote import Timeout

    assert Timeout.parse(spec) == replace(Timeout(), **want)


@pytest.mark.parametrize("spec", ["0", "-1", "nan", "inf", "total=", "wait=5", "5s"])
def test_bad_remote_timeout_is_one_line(spec, run, monkeypatch):
    result = run("--remote-timeout", spec, "inspect", "http://127.0.0.1:9/x.pth")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "remote timeout" in result.stderr
    monkeypatch.setenv("CKPTPORT_REMOTE_TIMEOUT", spec)
    result = run("inspect", "http://127.0.0.1:9/x.pth")
    assert result.exit_code == 2 and "remote timeout" in result.stderr


def test_the_watchdog_fires_in_a_forked_child():
    """A process forked after the watchdog started (a worker pool) has no watchdog thread
    of its own: it starts one when it first arms an alarm."""
    import os
    import time

    from ckptport.remote.deadline import armed

    with armed(time.monotonic() + 0.05) as alarm:
        time.sleep(0.2)
    assert alarm.fired
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its alarm fired
        with armed(time.monotonic() + 0.05) as alarm:
            time.sleep(0.3)
        os._exit(0 if alarm.fired else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_library_call_is_waited_for_until_the_deadline_only():
    """huggingface_hub's and boto3's requests hold their own sockets: ``bounded`` stops
    waiting at the deadline (the call's thread ends on its own socket timeouts)."""
    import threading

    from ckptport.errors import DeadlineError
    from ckptport.remote import Timeout, Transfers
    from ckptport.remote.deadline import bounded

    transfers, never = Transfers(Timeout(request=0.2)), threading.Event()
    with pytest.raises(DeadlineError, match="within 0.2 s"):
        bounded(lambda: never.wait(10), transfers, transfers.request_ends(), "s3://b/k")
    never.set()
    assert bounded(lambda: 7, transfers, transfers.request_ends(), "s3://b/k") == 7
    with pytest.raises(KeyError):
        bounded(lambda: {}["x"], transfers, transfers.request_ends(), "s3://b/k")


def test_object_changed_mid_read(server, run, tmp_path):
    """The object is rewritten after the first request: the pinned ETag no longer matches."""
    server.reset()
    server.objects["/moving.pth"] = server.objects["/model.pth"].read_bytes()  # type: ignore[union-attr]
    target = location(server.url + "/moving.pth")
    file = target.opened()
    server.objects["/moving.pth"] = b"x" + server.objects["/moving.pth"]  # type: ignore[operator]
    with pytest.raises(Exception, match="changed while it was read"):
        file.read(0, 100)
    assert file.changed()
    server.objects["/moving.pth"] = server.objects["/model.pth"]
    server.faults["change"] = 1  # rewritten right after the first request pinned it
    result = run("normalize", server.url + "/moving.pth", tmp_path / "o.pth", "-q")
    assert result.exit_code == 2 and "changed while it was read" in result.stderr
    assert f"{server.url}/moving.pth" in result.stderr
    assert not (tmp_path / "o.pth").exists()


def test_a_dst_at_the_path_a_url_folds_to_is_not_the_source(server, local, run, tmp_path,
                                                             monkeypatch):
    """A remote source is never a local file: DST at the local path ``os.path`` makes of
    the source's URL (``http:/host:port/...``) is written, not refused as the source file
    (``same_file`` once asked ``os.path`` about the URL's spelling)."""
    server.reset()
    url = server.url + "/model.safetensors"
    monkeypatch.chdir(tmp_path)
    folded = Path(os.path.realpath(url))
    folded.parent.mkdir(parents=True)
    result = run("normalize", url, folded, "-q")
    assert result.exit_code == 0, result.stderr
    assert run("normalize", local["safetensors"], tmp_path / "ours.safetensors", "-q"
               ).exit_code == 0
    assert folded.read_bytes() == (tmp_path / "ours.safetensors").read_bytes()


@pytest.mark.parametrize(("url", "message"), [
    ("http://127.0.0.1:9/model.pth", "cannot reach the server"),
    ("{server}/missing.pth", "not found (HTTP 404)"),
    ("{server}/secret.pth", "access denied (HTTP 403)"),
    ("ftp://host/model.pth", "ftp:// sources are not read"),
    ("{server}/", "names a folder"),
])
def test_bad_urls_are_one_line(server, run, tmp_path, monkeypatch, url, message):
    monkeypatch.setattr("ckptport.remote.fetching.BACKOFF", 0.01)
    given = url.format(server=server.url)
    for args in (("inspect", given), ("normalize", given, tmp_path / "o.pth")):
        result = run(*args)
        assert result.exit_code == 2, result.stdout
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


def test_credentials_never_printed(server, run, monkeypatch):
    monkeypatch.setattr("ckptport.remote.fetching.BACKOFF", 0.01)
    port = server.url.rsplit(":", 1)[1]
    url = f"http://user:hunter2@127.0.0.1:{port}/missing.pth?X-Amz-Signature=topsecret"
    result = run("inspect", url)
    assert result.exit_code == 2
    assert "hunter2" not in result.stderr and "topsecret" not in result.stderr
    assert f"http://***@127.0.0.1:{port}/missing.pth?***" in result.stderr
    shown = run("inspect", url.replace("missing", "model"), "--format", "json")
    assert shown.exit_code == 0 and "hunter2" not in shown.stdout
    assert "topsecret" not in shown.stdout


def test_remote_malicious_pickle_is_refused(server, run, tmp_path, sentinel):
    url = server.url + "/malicious.pth"
    result = run("normalize", url, tmp_path / "o.pth")
    assert result.exit_code == 2 and url in result.stderr
    shown = run("check", url, "--format", "json")
    assert shown.exit_code == 1 and "CKP003" in shown.stdout
    assert not sentinel.exists() and not (tmp_path / "o.pth").exists()


def test_s3_changed_object_and_folder(s3, local, run):
    import boto3

    path = location("s3://ckpts/run/model.pth")
    file = path.opened()
    boto3.client("s3").put_object(Bucket="ckpts", Key="run/model.pth", Body=b"rewritten")
    try:
        with pytest.raises(Exception, match="changed while it was read"):
            file.read(0, 64)
    finally:
        boto3.client("s3").upload_file(str(local["pth"]), "ckpts", "run/model.pth")
    for url, message in (("s3://ckpts/", "no checkpoint named as one in it: it holds run/, "
                                         "shards/"),
                         ("s3://ckpts/run/nothing.pth", "not found")):
        result = run("inspect", url)
        assert result.exit_code == 2 and message in result.stderr and url in result.stderr


def test_bucket_folders_are_read_by_the_layouts_of_local_ones(s3, local, run, tmp_path):
    """``s3://BUCKET/FOLDER/`` is asked of the readers' layouts from its listing, as a local
    folder is: a model folder reads as its weights file, a shard set's folder as the set."""
    for url, here in (("s3://ckpts/run/", local["safetensors"]),
                      ("s3://ckpts/shards/", local["shards"])):
        shown = json.loads(run("inspect", url, "--format", "json").stdout)
        mine = json.loads(run("inspect", here, "--format", "json").stdout)
        assert shown["format"] == mine["format"] and shown["tensors"] == mine["tensors"], url
    out = tmp_path / "set.safetensors"
    assert run("normalize", "s3://ckpts/shards/", out).exit_code == 0
    want = {k: v for shard in sorted(local["shards"].glob("*.safetensors"))
            for k, v in load_file(shard).items()}
    got = load_file(out)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], v) for k, v in want.items())


def test_without_the_extra_one_line(hub, run, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    result = run("inspect", f"hf://{REPO}")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "pip install 'ckptport[remote]'" in result.stderr


def test_url_grammar():
    hub = parse_url("hf://datasets/org/data@refs%2Fpr%2F3/sub/x.safetensors")
    assert (hub.repo_type, hub.host, hub.revision, hub.key) == (
        "dataset", "org/data", "refs/pr/3", "sub/x.safetensors")
    assert parse_url("hf://org/repo@refs/pr/3/x.bin").revision == "refs/pr/3"
    assert parse_url("hf://org/repo").key == "" and parse_url("hf://org/repo").revision is None
    assert str(location("hf://org/repo@v1/a/b.pth")) == "hf://org/repo@v1/a/b.pth"
    assert str(location("https://u:p@h:8/a//b?sig=1")) == "https://***@h:8/a//b?***"
    assert location("s3://b/k/model.pth").parent / "x.pth" == location("s3://b/k/x.pth")
    assert isinstance(location("./https:/x"), Path)


def test_start_up_imports_no_network_client():
    code = ("import sys, ckptport, ckptport.cli; "
            "print(sorted(m for m in ('boto3', 'botocore', 'huggingface_hub', 'http.client', "
            "'ckptport.remote.http') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, check=True)
    assert out.stdout.strip() == "[]"


def test_meter_counts_only_remote_use():
    meter.reset()
    assert meter.transferred() is None


@pytest.mark.parametrize("limit", [None, 1 << 20], ids=["on-disk", "in-memory"])
def test_spool_holds_each_fetched_byte_once(limit):
    """The spool's bookkeeping against a plain list of flags, over random ranges (a reread
    spanning several ranges kept apart, in memory)."""
    import random

    from ckptport.remote.objects import Spool

    rng = random.Random(1)
    data = rng.randbytes(5000)
    spool, held = Spool(limit), [False] * len(data)
    assert (spool.file is None) == (limit is not None)
    for _ in range(300):
        start = rng.randrange(len(data))
        stop = rng.randrange(start, min(len(data), start + 400) + 1)
        gaps = spool.missing(start, stop)
        assert [i for g in gaps for i in range(*g)] == [i for i in range(start, stop)
                                                        if not held[i]]
        for a, b in gaps:
            spool.keep(a, memoryview(data[a:b]))
            held[a:b] = [True] * (b - a)
        back = bytearray(stop - start)
        spool.read_into(start, memoryview(back))
        assert bytes(back) == data[start:stop]
    spool.close()


def test_only_rereading_commands_spool(server):
    from ckptport.readers import resolve
    from ckptport.sources import read_more_than_once

    assert resolve(server.url + "/model.pth").file.spool is None  # type: ignore[union-attr]
    with read_more_than_once():
        kept = resolve(server.url + "/shards/model.safetensors.index.json")
    assert kept.index is not None
    assert all(shard.opened().spool is not None for shard in kept.index.shards)


def test_normalize_transfers_each_byte_once(server, local, run, tmp_path):
    """Reading, hashing the source and verifying read the spool, not the network again."""
    server.reset()
    result = run("normalize", server.url + "/model.pth", tmp_path / "o.safetensors", "-q",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    # (the hashing thread waits for a range the reader is fetching, and the other way round)
    assert server.stats.bytes_sent <= local["pth"].stat().st_size + (64 << 10)
    assert _json(result)["transferred"]["bytes"] == server.stats.bytes_sent


def test_http_dst_is_refused(server, run, tmp_path):
    """s3:// destinations are written (test_remote_dst.py); an https:// one is not."""
    result = run("normalize", server.url + "/model.pth", server.url + "/out.safetensors")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"{server.url}/out.safetensors: http:// destinations are not written" \
        in result.stderr
    assert not Path("http:").exists()


def test_trust_reads_a_remote_object_as_a_local_file(server, local, run, tmp_path):
    """``--trust`` (torch.load, which opens paths only) reads the object into memory."""
    remote, here = tmp_path / "remote.pth", tmp_path / "here.pth"
    assert run("normalize", server.url + "/model.pth", remote, "--trust", "-q").exit_code == 0
    assert run("normalize", local["pth"], here, "--trust", "-q").exit_code == 0
    assert remote.read_bytes() == here.read_bytes()
    loaded = torch.load(remote, weights_only=True)
    assert loaded.keys() == _state(0).keys()  # the weights selected, as from a local file
    assert all(torch.equal(loaded[k], v) for k, v in _state(0).items())


def test_python_api_reads_remote(server, local):
    import ckptport

    remote = ckptport.read(server.url + "/model.safetensors").tree
    here = ckptport.read(local["safetensors"]).tree
    assert set(remote) == set(here)
    assert all(torch.equal(remote[k], here[k]) for k in here)
    shown = ckptport.inspect(server.url + "/model.pth", with_hash=True)
    assert shown.sha256 == ckptport.inspect(local["pth"], with_hash=True).sha256


def test_ci_recipe_gates_a_hub_artifact_against_a_manifest(hub, local, run, tmp_path):
    """docs/remote.md's recipe: the manifest made locally, the gate run on the hub copy."""
    committed = tmp_path / "model.manifest.json"
    assert run("manifest", local["shards"], "-o", committed).exit_code == 0
    gate = ("check", f"hf://{REPO}@main", "--against-manifest", committed,
            "--require-format", "safetensors-shards", "--format", "github")
    passed = run(*gate)
    assert passed.exit_code == 0, passed.stdout + passed.stderr
    other = tmp_path / "other.safetensors"  # another release's weights, same names and shapes
    save_file(_state(1), other)
    assert run("manifest", other, "-o", committed, "--overwrite").exit_code == 0
    failed = run(*gate)
    assert failed.exit_code == 1 and "CKP010" in failed.stdout


@pytest.mark.parametrize("pending", [1 << 20, 0], ids=["kept", "not-kept"])
@pytest.mark.parametrize("spool", ["1", "0"])
def test_the_source_hash_from_reads_in_any_order_is_the_files_hash(server, local, spool,
                                                                   pending, monkeypatch):
    """``normalize``'s source sha256 of a remote set is fed by the reads it makes anyway:
    reads in order, behind, far ahead, across the set's files, with or without a spool,
    give the hash of the files in order, and the bytes fetched for it are only those no
    read covered (a read far ahead is kept until the hash gets there, if it fits)."""
    from ckptport.readers import resolve
    from ckptport.remote import readhash
    from ckptport.remote.readhash import ReadDigest
    from ckptport.sources import read_more_than_once, sha256_files

    monkeypatch.setenv("CKPTPORT_REMOTE_SPOOL", spool)
    monkeypatch.setattr(readhash, "PENDING", pending)
    with read_more_than_once():
        source = resolve(server.url + "/shards/model.safetensors.index.json")
    files = [p for p in sorted(local["shards"].iterdir()) if p.suffix == ".json"] + \
        [p for p in sorted(local["shards"].iterdir()) if p.suffix != ".json"]
    expected = sha256_files(tuple(files))
    digest = ReadDigest(tuple(source.files))  # type: ignore[arg-type]
    first, second = (f.opened() for f in source.files[1:])  # type: ignore[attr-defined]
    half = first.size // 2
    for file, at, n in [(second, 1000, 5000),  # ahead of everything: left for the end
                        (first, 0, half), (first, 10, 100),  # in order, then behind
                        (first, half, first.size - half)]:
        file.read_into(at, memoryview(bytearray(n)))
    server.reset()
    assert digest.hexdigest() == expected
    # what is left: the second shard but the read far ahead (kept, or not: then the whole
    # shard); the index, read before the digest existed, was caught up from the spool (or
    # fetched: a few bytes)
    left = second.size - (5000 if pending else 0)
    assert left <= server.stats.bytes_sent <= left + 1024
    assert digest.pending_bytes == 0 and not digest.pending
