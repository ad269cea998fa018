"""``hf://`` destinations against the test hub server (``fixtures.servers``), spoken to by
huggingface_hub 2.x itself: preupload, the LFS batch API (basic transfer, verify) and the
NDJSON commit, with ``HF_HUB_DISABLE_XET`` so files go by LFS; and by Xet (``xet_hub``:
huggingface_hub's default once ``hf_xet`` is installed), ``hf_xet`` uploading xorbs and a
shard to the hub's CAS routes, from which the hub rebuilds each file (``fixtures.xet``).

Every output lands in one commit (or one pull request) holding exactly what a local
``normalize`` writes; a refusal or a fault (no such repository or branch, a token without
write access, an LFS upload failing, the branch moving meanwhile, Ctrl-C) is one line naming
DST, exit 2 (130), and no commit at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.servers import XET_TOKEN, HubRepo, ObjectServer

TOKEN = "hf_writetoken456"
REPO = "org/dst"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = torch.Generator().manual_seed(5)
    state = {f"module.layer{i}.weight": torch.randn(512, 1024, generator=g) for i in range(3)}
    path = tmp_path_factory.mktemp("hub_dst") / "ddp.pth"
    torch.save({"state_dict": state}, path)
    return path


@pytest.fixture(scope="module")
def served() -> Iterator[ObjectServer]:
    made = ObjectServer()
    made.token = TOKEN
    yield made
    made.close()


@pytest.fixture
def hub(served: ObjectServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectServer]:
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    served.reset()
    served.read_only = False
    served.repos[REPO] = HubRepo({"README.md": b"# a model\n"})
    yield served


def _files(hub: ObjectServer, revision: str = "main") -> dict[str, bytes]:
    found = hub.repos[REPO].at(revision)
    assert found is not None
    return {k: v.read_bytes() if isinstance(v, Path) else v for k, v in found[1].items()}


def _commits(hub: ObjectServer) -> int:
    return len(hub.repos[REPO].commits)


def test_a_file_is_one_commit_naming_its_source(hub, source, run, tmp_path):
    assert run("normalize", source, tmp_path / "model.safetensors", "-q").exit_code == 0
    result = run("normalize", source, f"hf://{REPO}/weights/model.safetensors", "-q")
    assert result.exit_code == 0, result.stderr
    files = _files(hub)
    assert files["weights/model.safetensors"] == (tmp_path / "model.safetensors").read_bytes()
    assert files["README.md"] == b"# a model\n" and _commits(hub) == 2
    commit = hub.repos[REPO].refs["main"]
    summary, description = hub.repos[REPO].messages[commit]
    assert summary == "Convert ddp.pth to safetensors with ckptport"
    assert str(source) in description and '"select": "auto"' in description
    assert "strip" in description or "prefix" in description
    again = run("normalize", source, f"hf://{REPO}/weights/model.safetensors", "-q")
    assert again.exit_code == 2 and "exists; pass --overwrite" in again.stderr
    assert _commits(hub) == 2


@pytest.mark.parametrize("transport", ["lfs", "xet"])
def test_a_shard_set_is_one_commit_or_one_pull_request(request, source, run, tmp_path,
                                                       transport):
    hub = request.getfixturevalue("hub" if transport == "lfs" else "xet_hub")
    assert run("normalize", source, tmp_path / "set", "--max-shard-size", "3MB",
               "-q").exit_code == 0
    local = {p.name: p.read_bytes() for p in (tmp_path / "set").iterdir()}
    assert len(local) == 4
    result = run("normalize", source, f"hf://{REPO}", "--max-shard-size", "3MB", "-q",
                 "--create-pr")
    assert result.exit_code == 0, result.stderr
    assert _files(hub) == {"README.md": b"# a model\n"}  # main is untouched
    assert _files(hub, "refs/pr/1") == {"README.md": b"# a model\n", **local}
    assert _commits(hub) == 2
    assert "pull request" in result.stdout
    direct = run("normalize", source, f"hf://{REPO}@main", "--max-shard-size", "3MB", "-q")
    assert direct.exit_code == 0, direct.stderr
    assert _files(hub) == {"README.md": b"# a model\n", **local} and _commits(hub) == 3
    replaced = run("normalize", source, f"hf://{REPO}", "--max-shard-size", "1GB", "-q",
                   "--overwrite")
    assert replaced.exit_code == 0, replaced.stderr
    assert sorted(_files(hub)) == ["README.md", "model.safetensors"]  # stale shards deleted


def test_remote_to_remote_through_the_hub(hub, source, run, tmp_path):
    assert run("normalize", source, f"hf://{REPO}/model.safetensors", "-q").exit_code == 0
    result = run("normalize", f"hf://{REPO}/model.safetensors", f"hf://{REPO}/model.pth",
                 "-q", "--create-pr")
    assert result.exit_code == 0, result.stderr
    (tmp_path / "back.pth").write_bytes(_files(hub, "refs/pr/1")["model.pth"])
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    expected = torch.load(source, weights_only=True)["state_dict"]
    assert all(torch.equal(back[k.removeprefix("module.")], v) for k, v in expected.items())
    commit = hub.repos[REPO].refs["refs/pr/1"]
    assert f"(commit {hub.repos[REPO].refs['main']})" in hub.repos[REPO].messages[commit][1]


def _move_branch(hub: ObjectServer) -> None:
    repo = hub.repos[REPO]
    repo.commits["f" * 40] = dict(repo.commits[repo.refs["main"]])
    repo.refs["main"] = "f" * 40


@pytest.mark.parametrize(("setup", "message"), [
    (lambda hub: setattr(hub, "read_only", True), "access denied (HTTP 403)"),
    (lambda hub: hub.faults.__setitem__("reject_upload", -1), "the hub refused"),
    (lambda hub: hub.repos.pop(REPO) and hub.repos.__setitem__("org/other", HubRepo({})),
     "no such repository 'org/dst'"),
], ids=["read-only-token", "upload-fails", "no-repository"])
@pytest.mark.parametrize("transport", ["lfs", "xet"])
def test_a_failure_commits_nothing(request, source, run, setup, message, transport):
    """By LFS and by Xet (the upload refused: an LFS object, or the CAS's xorbs)."""
    hub = request.getfixturevalue("hub" if transport == "lfs" else "xet_hub")
    saved = hub.repos.get(REPO)
    setup(hub)
    result = run("normalize", source, f"hf://{REPO}/m.safetensors", "-q")
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line.startswith(f"ckptport: error: hf://{REPO}/m.safetensors: ") and "\n" not in line
    assert message in line and TOKEN not in line and XET_TOKEN not in line
    if REPO in hub.repos:
        assert _commits(hub) == 1
    else:
        hub.repos[REPO] = saved


def test_no_such_branch_and_a_branch_that_moved(hub, source, run, monkeypatch):
    missing = run("normalize", source, f"hf://{REPO}@nobranch/m.safetensors", "-q")
    assert missing.exit_code == 2 and "no such branch 'nobranch'" in missing.stderr
    from ckptport.remote import commit

    staged = commit.HubStore.stage

    def stage_then_move(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = staged(self, *args, **kwargs)
        _move_branch(hub)  # another commit lands while ckptport uploads
        return made

    monkeypatch.setattr(commit.HubStore, "stage", stage_then_move)
    moved = run("normalize", source, f"hf://{REPO}/m.safetensors", "-q")
    assert moved.exit_code == 2
    assert "the branch main moved while the output was written" in moved.stderr
    assert "m.safetensors" not in _files(hub)


def test_ctrl_c_during_upload_commits_nothing(hub, source, run, monkeypatch):
    from ckptport.remote import commit

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(commit.HubStore, "stage", interrupted)
    result = run("normalize", source, f"hf://{REPO}/m.safetensors", "-q")
    assert result.exit_code == 130 and _commits(hub) == 1


def test_create_pr_needs_a_hub_destination(source, run, tmp_path):
    result = run("normalize", source, tmp_path / "x.pth", "--create-pr", "-q")
    assert result.exit_code == 2 and "--create-pr opens a pull request" in result.stderr


def _zoo(root: Path) -> Path:
    for i, rel in enumerate(("a/one.pth", "b/two.pth")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": {"module.w": torch.full((64, 64), float(i))}}, root / rel)
    return root


def test_folder_mode_into_a_hub_repository_is_one_commit(hub, run, tmp_path, monkeypatch):
    """``normalize zoo/ hf://org/repo``: every output in one commit (a pull request with
    ``--create-pr``), made after all are verified, its LFS uploads handed back by the worker
    processes; one failed file and nothing is committed. The repository then reads back as
    a folder SRC (``hf://org/repo``)."""
    from ckptport.remote import commit

    monkeypatch.setattr(commit, "INLINE", 0)  # every file by LFS, as a real shard goes
    zoo = _zoo(tmp_path / "zoo")
    args = ("--to", "safetensors", "--jobs", "1", "-q")
    assert run("normalize", zoo, tmp_path / "local", *args).exit_code == 0
    outputs = {"a/one.safetensors", "b/two.safetensors"}
    pr = run("normalize", zoo, f"hf://{REPO}", "--create-pr", *args)
    assert pr.exit_code == 0, pr.stderr
    assert "pull request" in pr.stdout and _commits(hub) == 2
    assert _files(hub) == {"README.md": b"# a model\n"}
    made = run("normalize", zoo, f"hf://{REPO}", *args, "--jobs", "2")
    assert made.exit_code == 0, made.stderr
    files = _files(hub)
    assert set(files) == {"README.md", *outputs} and _commits(hub) == 3
    assert all(files[o] == (tmp_path / "local" / o).read_bytes() for o in outputs)
    back = run("normalize", f"hf://{REPO}", tmp_path / "back", *args, "--format", "json")
    assert back.exit_code == 0, back.stderr
    assert run("normalize", tmp_path / "local", tmp_path / "again", *args).exit_code == 0
    assert all((tmp_path / "back" / o).read_bytes() == (tmp_path / "again" / o).read_bytes()
               for o in outputs)
    whole = (zoo / "a" / "one.pth").read_bytes()
    (zoo / "c").mkdir()
    (zoo / "c" / "cut.pth").write_bytes(whole[:len(whole) // 2])  # a checkpoint, cut short
    failed = run("normalize", zoo, f"hf://{REPO}/other", *args, "--format", "json")
    assert failed.exit_code == 1 and _commits(hub) == 3  # nothing committed
    assert "not committed" in failed.stdout and "other/a/one.safetensors" not in _files(hub)
    split = run("normalize", zoo, f"hf://{REPO}", *args, "--part", "1/2")
    assert split.exit_code == 2 and "one commit of the whole folder" in split.stderr


@pytest.fixture(scope="module")
def xet_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """hf_xet's cache and logs in the session's folder, not the user's: its one session per
    process remembers, in its shard cache, which chunks were uploaded to ``http://127.0.0.1``
    (any port), and would not send them to this run's server again."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("xet")
        patch.setenv("HF_XET_CACHE", str(folder / "cache"))
        patch.setenv("HF_XET_LOG_DEST", str(folder / "logs"))
        patch.setenv("HF_XET_TELEMETRY_ENABLED", "0")
        yield


@pytest.fixture
def xet_hub(hub: ObjectServer, monkeypatch: pytest.MonkeyPatch, xet_cache: None) -> ObjectServer:
    """The test hub with huggingface_hub's default upload path: through ``hf_xet`` (every
    LFS file once it is installed), to the hub's CAS routes (``fixtures.xet``), which keep
    the xorbs for the module, as a CAS keeps them."""
    pytest.importorskip("hf_xet")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", False)
    return hub


def test_a_set_through_xet_is_one_commit_of_what_hf_xet_sent(xet_hub, source, run, tmp_path):
    """The files go up as Xet xorbs and a shard; the hub rebuilds each file from them, and
    ckptport's read-back of the commit compares those bytes with what it wrote."""
    from huggingface_hub.utils import are_progress_bars_disabled

    assert run("normalize", source, tmp_path / "set", "--max-shard-size", "3MB",
               "-q").exit_code == 0
    bars = are_progress_bars_disabled()
    result = run("normalize", source, f"hf://{REPO}/set/", "--max-shard-size", "3MB", "-q")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""  # hf_xet's own progress reports kept off ckptport's stderr
    assert are_progress_bars_disabled() == bars  # and the library's setting given back
    files = _files(xet_hub)
    local = {f"set/{p.name}": p.read_bytes() for p in (tmp_path / "set").iterdir()}
    assert {k: v for k, v in files.items() if k.startswith("set/")} == local
    assert xet_hub.xorbs and _commits(xet_hub) == 2
    assert xet_hub.stats.by_path["/cas/v1/shards"] >= 1
