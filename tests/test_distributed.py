"""Distributed-training checkpoints written by the frameworks themselves, read offline.

Ground truth is the frameworks' own: DeepSpeed's
``get_fp32_state_dict_from_zero_checkpoint`` run on the very files
(ours, written by the session fixture, so loading them with full
unpickling is safe here), FSDP's gathered full state dict. Every output is
written by the CLI, loaded back with ``safetensors``/``torch.load(
weights_only=True)`` and compared bit for bit.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from fixtures.distributed import DS_CONFIGS, WS1, net_class
from tests.helpers import hostile_member, refused, repickle

ZERO_TO_FP32 = [c for c in DS_CONFIGS if c not in ("s0_bf16", "s1_bf16_fp32acc")]
CASES = [(2, c) for c in ZERO_TO_FP32] + [(1, c) for c in WS1 if c in ZERO_TO_FP32]


def _quiet(call: Any, *args: Any) -> Any:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return call(*args)


def _zero_to_fp32(folder: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return _quiet(get_fp32_state_dict_from_zero_checkpoint, str(folder))


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        assert _bits(got[key]) == _bits(tensor), key


def _normalize(run: Any, src: Path, dst: Path) -> dict[str, torch.Tensor]:
    """``src`` normalized by the CLI and loaded back; tied names of a .safetensors output
    restored from ckptport's ``ckptport.aliases`` metadata."""
    result = run("normalize", src, dst)
    assert result.exit_code == 0, result.stderr
    if dst.suffix != ".safetensors":
        return torch.load(dst, weights_only=True)
    loaded = load_file(dst)
    with safe_open(dst, "pt") as handle:
        aliases = json.loads((handle.metadata() or {}).get("ckptport.aliases", "{}"))
    for name, others in aliases.items():
        loaded.update(dict.fromkeys(others, loaded[name]))
    return loaded


def _module(folder: Path) -> dict[str, torch.Tensor]:
    """The half-precision ``module`` copy, from our own file."""
    tag = folder / (folder / "latest").read_text().strip()
    path = next(tag.glob("*mp_rank_00_model_states.pt"))
    return torch.load(path, weights_only=False)["module"]


@pytest.mark.parametrize(("world", "config"), CASES)
def test_zero_matches_zero_to_fp32(dist, run, tmp_path, world, config):
    folder = dist / "ds" / f"ws{world}" / config
    want = _zero_to_fp32(folder)
    got = _normalize(run, folder, tmp_path / "out.pth")
    _same(got, want)
    assert [k for k in got if k in want] == list(want)
    extra = {k: v for k, v in got.items() if k not in want}
    if DS_CONFIGS[config][0] == 1:  # frozen parameters: no fp32 copy; zero_to_fp32 drops them
        assert sorted(extra) == ["frozen.bias", "frozen.weight"]
        _same(extra, {k: _module(folder)[k] for k in extra})
    else:
        assert not extra


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("stage", [2, 3])
def test_lightning_deepspeed_matches_zero_to_fp32(dist, run, tmp_path, world, stage):
    folder = dist / "lightning" / f"ws{world}" / f"s{stage}" / "epoch=0.ckpt"
    want = _zero_to_fp32(folder)
    assert "model.fc1.weight" in want  # Lightning's own key names
    got = _normalize(run, folder, tmp_path / "out.pth")
    _same(got, want)
    assert list(got) == list(want)
    model = net_class()()
    model.load_state_dict({k.removeprefix("model."): v for k, v in got.items()}, strict=True)


def test_zero3_state_dict_loads_strictly_and_keeps_ties(dist, run, tmp_path):
    got = _normalize(run, dist / "ds" / "ws2" / "s3_bf16", tmp_path / "out.pth")
    model = net_class()()
    model.load_state_dict(got, strict=True)
    assert got["head.weight"].untyped_storage().data_ptr() == \
        got["emb.weight"].untyped_storage().data_ptr()


@pytest.mark.parametrize("world", [1, 2])
def test_bf16_optimizer_layout(dist, run, tmp_path, world):
    """ZeRO-1 with fp32 gradient accumulation (BF16_Optimizer): zero_to_fp32 refuses its
    files ("not a zero checkpoint"); DeepSpeed's own ZeRO-1/2 merge, fed the parsed
    files, is the truth."""
    from deepspeed.utils import zero_to_fp32 as z

    folder = dist / "ds" / f"ws{world}" / "s1_bf16_fp32acc"
    tag = folder / "global_step2"
    models = _quiet(z.parse_model_states, [str(tag / "mp_rank_00_model_states.pt")])
    optims = [torch.load(p, weights_only=False)["optimizer_state_dict"]
              for p in sorted(tag.glob("*optim_states.pt"))]
    assert len(optims) == world and all("zero_stage" not in o for o in optims)
    want = _quiet(z._get_fp32_state_dict_from_zero2_checkpoint, world,
                  [o["single_partition_of_fp32_groups"] for o in optims], models, False)
    got = _normalize(run, folder, tmp_path / "out.safetensors")
    _same(got, want)
    net_class()().load_state_dict(got, strict=True)


@pytest.mark.parametrize("world", [1, 2])
def test_stage0_bf16_gives_the_fp32_masters(dist, run, tmp_path, world):
    folder = dist / "ds" / f"ws{world}" / "s0_bf16"
    states = torch.load(folder / "global_step2" / "mp_rank_00_model_states.pt",
                        weights_only=False)
    masters = [t for group in states["optimizer"]["fp32_groups"] for t in group]
    model = net_class()()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(masters) == len(trainable)
    got = _normalize(run, folder, tmp_path / "out.safetensors")
    _same(got, dict(zip(trainable, masters, strict=True)))
    _same(got, {k: states["module"][k] for k in ("frozen.weight", "frozen.bias", "running")})
    for name in trainable:  # the module copy is the masters rounded: the matching is right
        assert torch.equal(got[name].to(torch.bfloat16), states["module"][name])
    model.load_state_dict(got, strict=True)


def test_inspect_shows_layout_and_the_half_copy(dist, run):
    result = run("inspect", dist / "ds" / "ws2" / "s3_bf16")
    assert result.exit_code == 0
    for fact in ("framework: deepspeed", "zero_stage: 3", "world_size: 2",
                 "tag: global_step2", "master_dtype: float32", "DANGEROUS"):
        assert (fact in result.stdout) is (fact != "DANGEROUS"), fact
    assert "--select module" in run("inspect", dist / "ds" / "ws2" / "s2_bf16").stdout


def test_tag_folder_and_latest_agree(dist, run, tmp_path):
    folder = dist / "ds" / "ws2" / "s2_fp32"
    whole = _normalize(run, folder, tmp_path / "a.safetensors")
    tag = _normalize(run, folder / "global_step2", tmp_path / "b.safetensors")
    _same(tag, whole)


# -- FSDP and DTensor rank files --------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2", "dtensor"])
def test_rank_files_match_the_full_state_dict(dist, run, tmp_path, world, kind):
    want = torch.load(dist / "truth" / f"ws{world}" / f"{kind}.pt", weights_only=True)
    got = _normalize(run, dist / kind / f"ws{world}", tmp_path / "out.pth")
    _same(got, want)
    assert list(got) == list(want)
    if kind != "dtensor":
        net_class()().load_state_dict(got, strict=True)


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2", "dtensor"])
def test_one_rank_file_is_data_not_dangerous(dist, run, tmp_path, kind):
    single = next((dist / kind / "ws2").glob("*rank0.pt"))
    result = run("inspect", single)
    assert result.exit_code == 0 and "DANGEROUS" not in result.stdout
    assert "world_size: int 2" in result.stdout
    checked = run("check", single)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout and "CKP003" not in \
        checked.stdout
    refused = run("normalize", single, tmp_path / "out.safetensors")
    assert refused.exit_code == 2 and "normalize the folder of all rank files" in \
        refused.stderr


def test_whole_dtensors_read_as_plain_tensors(dist, run, tmp_path):
    single = dist / "dtensor" / "ws1" / "state_rank0.pt"
    want = torch.load(dist / "truth" / "ws1" / "dtensor.pt", weights_only=True)
    _same(_normalize(run, single, tmp_path / "out.safetensors"), want)


def test_distributed_checkpoints_check_clean_of_layout_codes(dist, run):
    result = run("check", dist / "ds" / "ws2" / "s3_bf16", dist / "fsdp1" / "ws2",
                 dist / "fsdp2" / "ws2", "--ignore", "CKP002")
    assert result.exit_code == 0, result.stdout


# -- partial and inconsistent layouts --------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _checked(run: Any, src: Path, *words: str) -> str:
    result = run("check", src)
    assert result.exit_code == 1 and "CKP013" in result.stdout, result.stdout
    for word in words:
        assert word in result.stdout, result.stdout
    return result.stdout


def test_missing_zero_rank(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws2" / "s2_bf16", tmp_path / "ds")
    (folder / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    refused(run, folder, tmp_path / "out.safetensors", "global_step2", "rank 1 of 2")
    shown = _checked(run, folder, "rank 1 of 2 is missing")
    assert "CKP002" not in shown  # the cause, not what the other rank files name


def test_missing_zero3_model_states_rank(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws2" / "s3_fp32", tmp_path / "ds")
    (folder / "global_step2" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    refused(run, folder, tmp_path / "out.safetensors", "rank 1 of 2")


def test_stale_zero_ranks_from_a_bigger_run(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws2" / "s2_fp32", tmp_path / "ds")
    tag = folder / "global_step2"
    for rank in (2, 3):
        shutil.copy(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                    tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    _same(_normalize(run, folder, tmp_path / "out.safetensors"), _zero_to_fp32(
        dist / "ds" / "ws2" / "s2_fp32"))
    _checked(run, tag, "left over from an earlier run")


def test_zero_world_sizes_disagree(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws2" / "s2_bf16", tmp_path / "ds")
    shutil.copy(dist / "ds" / "ws1" / "s2_bf16" / "global_step2" / "mp_rank_00_model_states.pt",
                folder / "global_step2" / "mp_rank_00_model_states.pt")
    refused(run, folder, tmp_path / "out.safetensors", "1 data-parallel ranks")
    _checked(run, folder, "the optimizer states 2")


def test_missing_fsdp_rank_and_stale_rank(dist, run, tmp_path):
    folder = _copy(dist / "fsdp2" / "ws2", tmp_path / "fsdp")
    shutil.copy(folder / "model_rank1.pt", folder / "model_rank2.pt")
    _checked(run, folder, "model_rank2.pt", "left over")
    (folder / "model_rank1.pt").unlink()
    refused(run, folder, tmp_path / "out.safetensors", "rank 1 of 2 is missing")
    _checked(run, folder, "rank 1 of 2 is missing")


def test_fsdp_rank_files_of_different_runs(dist, run, tmp_path):
    folder = _copy(dist / "fsdp2" / "ws2", tmp_path / "fsdp")
    shutil.copy(dist / "fsdp2" / "ws1" / "model_rank0.pt", folder / "model_rank1.pt")
    refused(run, folder, tmp_path / "out.safetensors", "model_rank1.pt", "holds no shard")
    _checked(run, folder, "holds no shard")


def test_overlapping_shards(dist, run, tmp_path):
    """FSDP1 rank 1's shard of emb.weight (11 rows: 6 + 5) claimed at row 5, not 6."""
    folder = _copy(dist / "fsdp1" / "ws2", tmp_path / "fsdp")
    repickle(dist / "fsdp1" / "ws2" / "model_rank1.pt", folder / "model_rank1.pt",
              b"K\x06K\x00e", b"K\x05K\x00e")
    refused(run, folder, tmp_path / "out.safetensors", "emb.weight", "overlap")
    _checked(run, folder, "overlap")


@pytest.mark.parametrize(("config", "shape", "words"), [
    ("s2_fp32", None, "shorter than param_shapes need"),
    ("s3_fp32", None, "shorter than param_shapes need"),
    ("s2_fp32", (70, 13), "fc2.weight needs elements"),
    ("s3_fp32", (7, 12), "lying shapes or a short group")])
def test_short_flat_group_and_lying_numels(dist, run, tmp_path, config, shape, words):
    """Every rank's flat groups cut short by 8 elements, or param_shapes lying about
    fc2.weight (7 x 13)."""
    folder = _copy(dist / "ds" / "ws2" / config, tmp_path / "ds")
    tag = folder / "global_step2"
    if shape is None:
        for path in tag.glob("*optim_states.pt"):
            state = torch.load(path, weights_only=False)
            osd = state["optimizer_state_dict"]
            key = "fp32_flat_groups" if "fp32_flat_groups" in osd else \
                "single_partition_of_fp32_groups"
            osd[key] = [g[:-8].clone() for g in osd[key]]
            torch.save(state, path)
    else:  # every rank's model states lie alike (one that differs is another run's)
        for path in tag.glob("*model_states.pt"):
            state = torch.load(path, weights_only=False)
            state["param_shapes"][0]["fc2.weight"] = torch.Size(shape)
            torch.save(state, path)
    refused(run, folder, tmp_path / "out.safetensors", words)


@pytest.mark.parametrize(("config", "kind", "forge", "words"), [
    # a world size of 10**12 from a 1 KB field: refused at once, no walk over the ranks
    ("s2_fp32", "optim", lambda state: state["optimizer_state_dict"].update(
        partition_count=[10**12]), "the optimizer states 1000000000000"),
    ("s2_fp32", "optim", lambda state: state["optimizer_state_dict"].update(
        partition_count=[1, "a"]), "partition_count"),
    ("s0_bf16", "model", lambda state: state.update(buffer_names=[["x"]]), "buffer_names"),
])
def test_forged_fields_are_one_line(dist, run, tmp_path, config, kind, forge, words):
    """Fields the files carry are types and sizes ckptport checks, never trusts."""
    folder = _copy(dist / "ds" / "ws2" / config, tmp_path / "ds")
    path = sorted((folder / "global_step2").glob(f"*{kind}_states.pt"))[0]
    state = torch.load(path, weights_only=False)
    forge(state)
    torch.save(state, path)
    refused(run, folder, tmp_path / "out.safetensors", words)
    result = run("check", folder)  # a report: the file is unreadable, not a crash
    assert result.exit_code in (1, 2) and "Traceback" not in result.stderr, result.stderr


def test_missing_ranks_never_walks_a_forged_world_size():
    from ckptport.readers.layouts import missing_ranks

    assert missing_ranks({0: "a", 1: "b"}, 2) is None
    assert missing_ranks({0: "a", 1: "b", 5: "stale"}, 2) is None
    assert missing_ranks({0: "a", 2: "c"}, 10**15) == (1, 10**15 - 2)  # at once
    assert missing_ranks({}, 1) == (0, 1)


def test_shared_params_naming_a_list_is_ignored_like_a_missing_name(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws2" / "s2_fp32", tmp_path / "ds")
    for path in (folder / "global_step2").glob("*model_states.pt"):
        state = torch.load(path, weights_only=False)
        state["shared_params"]["forged"] = ["fc1.weight"]
        torch.save(state, path)
    got = _normalize(run, folder, tmp_path / "out.safetensors")
    assert "forged" not in got
    _same(got, _zero_to_fp32(dist / "ds" / "ws2" / "s2_fp32"))


def test_latest_naming_a_missing_tag_or_outside(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws1" / "s2_bf16", tmp_path / "ds")
    for tag, words in (("global_step9", ("latest", "global_step9")),
                       ("../ws2", ("latest", "not a tag folder inside")),
                       ("/etc", ("latest", "not a tag folder inside"))):
        (folder / "latest").write_text(tag)
        result = run("normalize", folder, tmp_path / "out.safetensors")
        assert result.exit_code == 2 and all(w in result.stderr for w in words), result.stderr
        assert "\n" not in result.stderr.strip()
        assert not (tmp_path / "out.safetensors").exists()


def test_truncated_rank_file(dist, run, tmp_path):
    folder = _copy(dist / "ds" / "ws2" / "s3_bf16", tmp_path / "ds")
    path = folder / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    path.write_bytes(path.read_bytes()[:-600])
    refused(run, folder, tmp_path / "out.safetensors", path.name)
    result = run("check", folder)
    assert result.exit_code == 2 and f"{path}: CKP008" in result.stdout  # the member file


@pytest.mark.parametrize("kind", ["ds", "fsdp"])
def test_hostile_rank_file(dist, run, tmp_path, sentinel, kind):
    if kind == "ds":
        folder = _copy(dist / "ds" / "ws2" / "s3_bf16", tmp_path / "ds")
        victim = folder / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    else:
        folder = _copy(dist / "fsdp2" / "ws2", tmp_path / "fsdp")
        victim = folder / "model_rank1.pt"
    checked = hostile_member(run, folder, victim, sentinel, tmp_path / "out.safetensors",
                             victim.name)  # CKP003 on the member file
    assert "os.system" in checked
    assert "DANGEROUS" in run("inspect", folder).stdout
    assert not sentinel.exists()


def _latest_absolute(folder: Path) -> None:
    (folder / "latest").write_text(str(folder / "global_step2"))


def _latest_outside(folder: Path) -> None:
    outside = folder.parent / "elsewhere"
    outside.write_text("global_step2")
    (folder / "latest").unlink()
    (folder / "latest").symlink_to(outside)


@pytest.mark.parametrize(("spoil", "cause"), [
    (_latest_absolute, "not a tag folder inside the checkpoint folder"),
    (_latest_outside, "a link out of the checkpoint folder"),
    (lambda f: (f / "latest").write_text("global_step2\nglobal_step1"), "not a tag folder"),
    (lambda f: (f / "latest").write_bytes(b"g" * 5000), "too large"),
    (lambda f: (f / "latest").write_bytes(b"global_step\xff"), "cannot read the tag"),
])
def test_a_bad_latest_is_refused_alike_by_every_command(dist, run, tmp_path, spoil, cause):
    """``check`` reads the save folder's ``latest`` as ``normalize`` does: the same refusal,
    naming ``latest``, and the gate fails."""
    folder = _copy(dist / "ds" / "ws2" / "s2_fp32", tmp_path / "save")
    spoil(folder)
    line = refused(run, folder, tmp_path / "out.safetensors", cause)
    assert line.startswith(f"ckptport: error: {folder / 'latest'}:"), line
    shown = run("inspect", folder)
    assert shown.exit_code == 2 and cause in shown.stderr
    root = folder.parent
    checked = run("check", root)  # the folder walk reads it as normalize does
    assert checked.exit_code == 2, checked.stdout
    assert f"{folder / 'latest'}: CKP008" in checked.stdout and cause in checked.stdout


def test_half_precision_copy_by_select_module(dist, run, tmp_path):
    folder = dist / "ds" / "ws2" / "s2_bf16"
    note = run("inspect", folder).stdout
    assert "--select module" in note
    model_states = folder / "global_step2" / "mp_rank_00_model_states.pt"
    result = run("normalize", model_states, "--select", "module", tmp_path / "half.pth")
    assert result.exit_code == 0, result.stderr
    _same(torch.load(tmp_path / "half.pth", weights_only=True), _module(folder))


def test_folder_mode_converts_each_layout_once(dist, run, tmp_path):
    result = run("normalize", dist / "ds" / "ws2", tmp_path / "out")
    assert result.exit_code == 0, result.stdout + result.stderr
    got = torch.load(tmp_path / "out" / "s3_fp32" / "global_step2.pth", weights_only=True)
    _same(got, _zero_to_fp32(dist / "ds" / "ws2" / "s3_fp32"))
    result = run("normalize", dist / "fsdp1", tmp_path / "fsdp")
    assert result.exit_code == 0, result.stdout + result.stderr
    _same(torch.load(tmp_path / "fsdp" / "ws2.pth", weights_only=True),
          torch.load(dist / "truth" / "ws2" / "fsdp1.pt", weights_only=True))


def test_tag_picks_a_tag_and_latest_is_the_default(dist, run, tmp_path):
    """``--tag NAME`` reads that tag folder; without it ``latest`` decides, as DeepSpeed's."""
    import shutil

    folder = tmp_path / "save"
    shutil.copytree(dist / "ds" / "ws2" / "s2_fp32", folder)
    shutil.copytree(folder / "global_step2", folder / "global_step1")
    (folder / "latest").write_text("global_step1")
    whole = _normalize(run, folder / "global_step2", tmp_path / "want.safetensors")
    result = run("normalize", folder, tmp_path / "tagged.safetensors", "--tag", "global_step2")
    assert result.exit_code == 0, result.stderr
    _same(_normalize(run, tmp_path / "tagged.safetensors", tmp_path / "again.safetensors"),
          whole)
    shown = run("inspect", folder, "--tag", "global_step2", "--format", "json")
    assert shown.exit_code == 0 and "global_step2" in shown.stdout
    missing = run("normalize", folder, tmp_path / "x.pth", "--tag", "global_step9")
    assert missing.exit_code == 2 and "tags: global_step1, global_step2" in missing.stderr
    elsewhere = run("normalize", dist / "fsdp1" / "ws2", tmp_path / "y.pth", "--tag", "a")
    assert elsewhere.exit_code == 2 and "not a DeepSpeed checkpoint folder" in elsewhere.stderr


@pytest.mark.parametrize("args", [
    ("normalize", "{file}", "{out}"), ("inspect", "{file}"), ("manifest", "{file}"),
    ("check", "{file}"), ("diff", "{file}", "{file}"),
    ("normalize", "{zoo}", "{out_dir}"),  # folder mode: one tag cannot fit every save
])
def test_a_tag_that_names_nothing_is_refused_not_ignored(fx, run, tmp_path, args):
    """A file read as is would pass for the tag the user named: exit 2, nothing written."""
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    shutil.copy(fx["ddp_cuda3"], zoo / "a.pth")
    values = {"file": fx["ddp_cuda3"], "out": tmp_path / "o.safetensors", "zoo": zoo,
              "out_dir": tmp_path / "outs"}
    result = run(*(a.format(**values) for a in args), "--tag", "global_step9")
    assert result.exit_code == 2 and "--tag" in result.stderr, result.stdout
    assert not (tmp_path / "o.safetensors").exists() and not (tmp_path / "outs").exists()


def test_load_into_takes_the_tag(dist, tmp_path):
    """The Python loaders read a tag as the commands do; a tag on a file is refused."""
    import ckptport

    folder = tmp_path / "save"
    shutil.copytree(dist / "ds" / "ws2" / "s2_fp32", folder)
    shutil.copytree(folder / "global_step2", folder / "global_step1")
    (folder / "latest").write_text("global_step1")
    tagged = ckptport.load_state_dict(folder, tag="global_step2")
    want = ckptport.load_state_dict(folder / "global_step2")
    assert tagged.keys() == want.keys() and all(torch.equal(tagged[k], want[k]) for k in want)
    with pytest.raises(ckptport.OptionError, match="--tag"):
        ckptport.load_state_dict(dist / "fsdp1" / "ws2" / "model_rank0.pt", tag="x")


# -- whole or refused: one rank, one file; one run; pieces that tile ---------------------

OTHER = "another run's file"  # what a second spelling of a rank is copied from


def _ds(dist: Path, tmp: Path, config: str) -> tuple[Path, Path]:
    folder = _copy(dist / "ds" / "ws2" / config, tmp / "ds")
    return folder, folder / "global_step2"


# (config, file copied in, from which run's tag folder, the new name, words of the refusal)
DS_SPELLINGS = {
    "leading zeros (optimizer rank)": (
        "s2_fp32", "zero_pp_rank_1_mp_rank_00_optim_states.pt", "s1_fp32",
        "zero_pp_rank_01_mp_rank_00_optim_states.pt", "rank 1's optimizer states"),
    "leading zeros (ZeRO-3 model states rank)": (
        "s3_fp32", "zero_pp_rank_1_mp_rank_00_model_states.pt", "s3_bf16",
        "zero_pp_rank_001_mp_rank_00_model_states.pt", "rank 1's model states"),
    "leading zeros (model-parallel rank)": (
        "s2_fp32", "mp_rank_00_model_states.pt", "s1_fp32", "mp_rank_0_model_states.pt",
        "rank 0's model states"),
    "bf16_ beside a plain optimizer file of one rank": (
        "s2_bf16", "zero_pp_rank_1_mp_rank_00_optim_states.pt", "s2_fp32",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt", "optimizer states of two kinds"),
    "two model-states kinds": (
        "s2_fp32", "zero_pp_rank_0_mp_rank_00_model_states.pt", "s3_fp32",
        "zero_pp_rank_0_mp_rank_00_model_states.pt", "model states of two kinds"),
    "Arabic-Indic digit": (
        "s2_fp32", "zero_pp_rank_1_mp_rank_00_optim_states.pt", "s1_fp32",
        "zero_pp_rank_\u0661_mp_rank_00_optim_states.pt", "cannot read"),
    "fullwidth digit": (
        "s3_fp32", "zero_pp_rank_1_mp_rank_00_model_states.pt", "s3_fp32",
        "zero_pp_rank_\uff11_mp_rank_00_model_states.pt", "cannot read"),
    "upper case": (
        "s2_fp32", "zero_pp_rank_1_mp_rank_00_optim_states.pt", "s1_fp32",
        "ZERO_PP_RANK_1_MP_RANK_00_optim_states.pt", "cannot read"),
}


@pytest.mark.parametrize("spelling", DS_SPELLINGS)
def test_a_deepspeed_rank_claimed_twice_is_refused(dist, run, tmp_path, spelling):
    """Every way two names can mean one DeepSpeed rank file: refused naming both, as
    zero_to_fp32 refuses the folder; before, the later name silently replaced the earlier
    and the output mixed two runs' weights."""
    config, name, other, new, words = DS_SPELLINGS[spelling]
    folder, tag = _ds(dist, tmp_path, config)
    shutil.copy(dist / "ds" / "ws2" / other / "global_step2" / name, tag / new)
    line = refused(run, folder, tmp_path / "out.safetensors", words, new)
    assert "global_step2" in line
    _checked(run, folder, "CKP013", words)


def test_a_deepspeed_optimizer_of_mixed_kinds_across_ranks_is_refused(dist, run, tmp_path):
    folder, tag = _ds(dist, tmp_path, "s2_bf16")
    (tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").rename(
        tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    refused(run, folder, tmp_path / "out.safetensors", "optimizer states of two kinds")


@pytest.mark.parametrize(("config", "kind", "fact", "value"), [
    ("s3_fp32", "model", "global_steps", 3),  # another step of this run, ZeRO-3
    ("s2_fp32", "optim", "ds_config", {"zero_optimization": {"stage": 2}}),
    ("s3_bf16", "optim", "ds_version", "0.18.0"),
])
def test_a_deepspeed_rank_file_of_another_run_is_refused(dist, run, tmp_path, config, kind,
                                                         fact, value):
    """What one save records alike in every rank file (its config, version, step and
    model facts) must agree; a rank file copied in from another save is refused."""
    folder, tag = _ds(dist, tmp_path, config)
    path = sorted(tag.glob(f"*rank_1_mp_rank_00_{kind}_states.pt"))[0]
    state = torch.load(path, weights_only=False)
    state[fact] = value
    torch.save(state, path)
    refused(run, folder, tmp_path / "out.safetensors", path.name, f"another {fact}",
             "different runs")
    _checked(run, folder, f"another {fact}")


@pytest.mark.parametrize(("kind", "new"), [
    ("fsdp2", "model_rank01.pt"), ("fsdp1", "model_rank001.pt"), ("dtensor", "state_rank01.pt")])
def test_a_rank_file_under_two_spellings_is_refused(dist, run, tmp_path, kind, new):
    folder = _copy(dist / kind / "ws2", tmp_path / kind)
    shutil.copy(folder / next(p.name for p in folder.glob("*rank1.pt")), folder / new)
    refused(run, folder, tmp_path / "out.safetensors", "rank 1 is claimed by 2 files", new)
    _checked(run, folder, "rank 1 is claimed by 2 files")


@pytest.mark.parametrize("new", ["model_rank\u0661.pt", "model_rank_1.pt", "MODEL_RANK1.pt",
                                 "model_rank1.pth", "model-rank1.pt"])
def test_a_second_rank_file_set_is_not_one_checkpoint(dist, run, tmp_path, new):
    """Names that spell rank 1 another way (non-ASCII digits, which int() reads as 1; another
    separator, case or extension): the folder is no longer one set of rank files, so it is
    not read as one checkpoint, and each rank file alone is partial."""
    folder = _copy(dist / "fsdp2" / "ws2", tmp_path / "fsdp2")
    shutil.copy(folder / "model_rank1.pt", folder / new)
    result = run("normalize", folder, tmp_path / "out.safetensors")
    assert result.exit_code == 2 and not (tmp_path / "out.safetensors").exists()
    _checked(run, folder, "holds rank 1's shard")


def test_a_rank_file_holding_another_ranks_shard_is_refused(dist, run, tmp_path):
    """Two files, two names, one rank's shard (the DTensor says which rank saved it)."""
    folder = _copy(dist / "dtensor" / "ws2", tmp_path / "dtensor")
    shutil.copy(folder / "state_rank0.pt", folder / "state_rank1.pt")
    refused(run, folder, tmp_path / "out.safetensors", "state_rank1.pt",
             "holds rank 0's shard")
    _checked(run, folder, "holds rank 0's shard")


# -- DCP: chunks proven to tile before torch.empty -------------------------------------


def _dcp_truth(folder: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DCP's own load of a sharded save into whole tensors (resharding, no process group)."""
    import torch.distributed.checkpoint as dcp

    target = {k: torch.zeros_like(v) for k, v in like.items()}
    _quiet(lambda: dcp.load(target, checkpoint_id=str(folder), no_dist=True))
    return target


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("kind", ["fsdp2", "dtensor"])
def test_a_sharded_dcp_save_matches_dcps_own_load(dist, run, tmp_path, world, kind):
    folder = dist / "dcp" / f"ws{world}" / kind
    want = _dcp_truth(folder, torch.load(dist / "truth" / f"ws{world}" / f"{kind}.pt",
                                         weights_only=True))
    _same(_normalize(run, folder, tmp_path / "out.safetensors"), want)


def _forge_dcp(src: Path, dst: Path, fqn: str, forge: Any) -> Path:
    import pickle

    from torch.distributed.checkpoint.metadata import MetadataIndex

    folder = _copy(src, dst)
    with (folder / ".metadata").open("rb") as f:
        metadata = pickle.load(f)  # our own file, written by the session's fixture
    item = metadata.state_dict_metadata[fqn]
    forge(item, metadata.storage_data, MetadataIndex)
    with (folder / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    return folder


def _grow(item: Any, storage: Any, index: Any) -> None:
    item.size = torch.Size([item.size[0] + 2])  # 7 elements declared as 9: 7, 8 uncovered


def _shift(item: Any, storage: Any, index: Any) -> None:
    chunk = item.chunks[1]  # rank 1's chunk [4, 7) claimed at [3, 6)
    info = storage.pop(index("shard0", chunk.offsets))
    chunk.offsets = torch.Size([3])
    storage[index("shard0", chunk.offsets)] = info


def _no_data(item: Any, storage: Any, index: Any) -> None:
    del storage[index("shard0", item.chunks[1].offsets)]


@pytest.mark.parametrize(("forge", "words"), [
    (_grow, ("no piece holds element 7 of its [9]", "a missing or short shard")),
    (_shift, ("element 3 of its [7] is held by 2 pieces", "__0_0.distcp", "__1_0.distcp")),
    (_no_data, ("chunk at [4] has no data",)),
])
def test_dcp_chunks_that_do_not_tile_are_refused_before_allocating(dist, run, tmp_path, forge,
                                                                   words):
    """A .metadata declaring more elements than its chunks hold left the rest as whatever
    torch.empty returned; chunks that overlap, or have no data, are refused alike."""
    folder = _forge_dcp(dist / "dcp" / "ws2" / "dtensor", tmp_path / "dcp", "shard0", forge)
    refused(run, folder, tmp_path / "out.safetensors", "'shard0'", *words)
    result = run("check", folder)
    assert result.exit_code in (1, 2) and "'shard0'" in result.stdout, result.stdout


# -- torch's HuggingFaceStorageWriter: per-rank safetensors shards, one checkpoint --------


def _hf(dist: Path, world: int, kind: str) -> Path:
    return dist / "hf" / f"ws{world}" / kind / "sharded"


def _consolidated(folder: Path) -> dict[str, torch.Tensor]:
    """torch's own consolidation of the shards (enable_consolidation=True wrote it)."""
    whole: dict[str, torch.Tensor] = {}
    for path in sorted(folder.parent.glob("model-*.safetensors")):
        whole.update(load_file(path))
    return whole


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("kind", ["fsdp2", "dtensor"])
def test_hf_storage_writer_shards_match_torchs_consolidation(dist, run, tmp_path, world, kind):
    folder = _hf(dist, world, kind)
    want = _consolidated(folder)
    got = _normalize(run, folder, tmp_path / "out.safetensors")
    assert sorted(got) == sorted(want)
    _same(got, want)
    _same(got, torch.load(dist / "truth" / f"ws{world}" / f"{kind}.pt", weights_only=True))
    checked = run("check", folder)
    assert checked.exit_code == 0, checked.stdout


@pytest.mark.parametrize(("name", "words"), [
    ("shard-00002-model-00001-of-00002.safetensors",
     ("rank 2's shard file", "'fc1.weight' is its part at [7, 0]")),
    ("shard-00001-model-00001-of-00002.safetensors",
     ("rank 1's shard file", "other ranks' parts")),
])
def test_one_hf_storage_writer_shard_alone_is_partial(dist, run, tmp_path, name, words):
    """Read alone, a rank's shard file was written as whole ((7, 7) of fc1.weight's
    (13, 6)), verified, and passed check."""
    path = _hf(dist, 2, "fsdp2") / name
    refused(run, path, tmp_path / "out.safetensors", *words)
    _checked(run, path, *words)
    assert run("inspect", path).exit_code == 0


def _resharded(path: Path, fqn: str, offsets: list[int]) -> None:
    """``path`` rewritten with another DCP_SHARDING_INFO offset for ``fqn`` (a lie)."""
    from safetensors.torch import save_file

    with safe_open(path, "pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    info = json.loads(metadata["DCP_SHARDING_INFO"])
    info[fqn]["saved_offsets"] = offsets
    save_file(tensors, path, {**metadata, "DCP_SHARDING_INFO": json.dumps(info)})


def _drop(folder: Path, name: str) -> None:
    (folder / name).unlink()


@pytest.mark.parametrize(("forge", "words"), [
    (lambda f: _drop(f, "shard-00001-model-00001-of-00002.safetensors"),
     ("no piece holds element (0, 0)", "fc1.weight")),
    (lambda f: [_drop(f, n) for n in ("shard-00001-model-00002-of-00002.safetensors",
                                      "shard-00002-model-00002-of-00002.safetensors")],
     ("model file 2 of 2 has no shard file",)),
    (lambda f: shutil.copy(f / "shard-00002-model-00001-of-00002.safetensors",
                           f / "shard-2-model-1-of-00002.safetensors"),
     ("claimed by 2 files", "shard-2-model-1-of-00002.safetensors")),
    (lambda f: shutil.copy(f / "shard-00002-model-00001-of-00002.safetensors",
                           f / "shard-00003-model-00001-of-00003.safetensors"),
     ("2 different counts of model files", "different saves")),
    (lambda f: _resharded(f / "shard-00002-model-00001-of-00002.safetensors", "fc1.weight",
                          [6, 0]),
     ("element (6, 0) of its [12, 6] is held by 2 pieces", "overlapping")),
    (lambda f: _resharded(f / "shard-00002-model-00001-of-00002.safetensors", "fc1.weight",
                          [7, 1]),
     ("fc1.weight", "no piece holds element (0, 6) of its [13, 7]")),
])
def test_hf_storage_writer_shards_that_are_not_whole_are_refused(dist, run, tmp_path, forge,
                                                                 words):
    """A rank's file gone, a model file's every shard gone, a rank under two spellings, a
    file of another save, offsets that overlap or leave a gap: exit 2 naming the cause,
    CKP013 in check."""
    folder = _copy(_hf(dist, 2, "fsdp2"), tmp_path / "sharded")
    forge(folder)
    refused(run, folder, tmp_path / "out.safetensors", *words)
    _checked(run, folder, *words)


def test_an_hf_shard_file_under_a_name_that_is_no_shard_name(dist, run, tmp_path):
    """Non-ASCII digits in a shard file's name: not one of the layout's names, so the folder
    is a folder of checkpoints (refused as one), and each file read alone is partial."""
    folder = _copy(_hf(dist, 2, "fsdp2"), tmp_path / "sharded")
    shutil.copy(folder / "shard-00002-model-00001-of-00002.safetensors",
                folder / "shard-0000\u0662-model-00001-of-00002.safetensors")
    refused(run, folder, tmp_path / "out.safetensors", "is a folder of checkpoints")
    _checked(run, folder, "'fc1.weight' is its part at [7, 0]")


@pytest.mark.parametrize(("layout", "victim"), [
    ("fsdp2/ws2", "model_rank1.pt"),
    ("fsdp1/ws2", "model_rank1.pt"),
    ("dcp/ws2/dtensor", "__1_0.distcp"),
    ("hf/ws2/fsdp2/sharded", "shard-00002-model-00001-of-00002.safetensors"),
])
def test_a_truncated_member_of_every_sharded_layout_is_refused(dist, run, tmp_path, layout,
                                                               victim):
    """A rank file cut short (a partial copy): exit 2 naming the file, nothing written."""
    folder = _copy(dist / layout, tmp_path / "layout")
    path = folder / victim
    path.write_bytes(path.read_bytes()[:-40])
    refused(run, folder, tmp_path / "out.safetensors", victim)
    result = run("check", folder)
    assert result.exit_code in (1, 2) and victim in result.stdout, result.stdout
    assert "Traceback" not in result.stderr
