"""Key surgery (--subtree/--keep/--drop/--rename/--map), source metadata, tied names in
manifests, --hash-name."""

from __future__ import annotations

import fnmatch
import json
import re
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import ckptport
from ckptport.analysis.manifests import load_manifest
from ckptport.checkpoint import Checkpoint, Format, SourceFacts
from ckptport.errors import RuleError
from ckptport.rules import NormalizeOptions, load_recipe
from ckptport.rules.recipes import KEY_MAP_SHA256, key_rules

RECIPE_TOML = r"""
# backbone of a detector checkpoint, torchvision-style names
steps = [
  { subtree = "backbone" },
  { drop = ["*.num_batches_tracked"] },
  { rename = ['^(\d+)\.', 'stage\1.'] },
]
"""


def _detector_state() -> OrderedDict[str, torch.Tensor]:
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    state = OrderedDict((f"backbone.{k}", v) for k, v in body.state_dict().items())
    state["head.fc.weight"] = torch.randn(2, 4)
    state["head.fc.bias"] = torch.randn(2)
    state._metadata = OrderedDict([("", {"version": 1}), ("backbone", {"version": 1}),
                                   ("backbone.1", {"version": 2}), ("head.fc", {"version": 1})])
    return state


@pytest.fixture(scope="session")
def det(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A detector-style DDP checkpoint (module. prefix, _metadata) and a recipe."""
    folder = tmp_path_factory.mktemp("keys")
    state = _detector_state()
    wrapped = OrderedDict((f"module.{k}", v) for k, v in state.items())
    wrapped._metadata = OrderedDict((f"module.{k}" if k else k, v)
                                    for k, v in state._metadata.items())
    torch.save({"state_dict": wrapped, "epoch": 3}, folder / "det.pth")
    (folder / "recipe.toml").write_text(RECIPE_TOML)
    (folder / "recipe.json").write_text(json.dumps({"steps": [
        {"subtree": "backbone"}, {"drop": "*.num_batches_tracked"},
        {"rename": [r"^(\d+)\.", r"stage\1."]}]}))
    return {"det": folder / "det.pth", "toml": folder / "recipe.toml",
            "json": folder / "recipe.json", "dir": folder}


def _loaded(path: Path) -> OrderedDict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


# -- the steps, end to end ---------------------------------------------------------------


def test_subtree_drop_rename_in_order_with_versions(run, det, tmp_path):
    out = tmp_path / "bb.pth"
    result = run("normalize", det["det"], out, "--subtree", "backbone",
                 "--drop", "*.num_batches_tracked", "--rename", r"^(\d+)\.", r"stage\1.",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    truth = _detector_state()
    loaded = _loaded(out)
    expected = {re.sub(r"^(\d+)\.", r"stage\1.", k.removeprefix("backbone.")): v
                for k, v in truth.items()
                if k.startswith("backbone.") and not k.endswith("num_batches_tracked")}
    assert list(loaded) == list(expected)
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())
    # module versions follow: backbone -> root, backbone.1 -> stage1, head.fc and the old root go
    assert dict(loaded._metadata) == {"": {"version": 1}, "stage1": {"version": 2}}
    report = json.loads(result.stdout)
    rules = {r["rule"]: r for r in report["rules"]}
    assert [r["rule"] for r in report["rules"]][3:7] == ["strip-prefixes", "subtree",
                                                        "keep-drop", "rename"]
    dropped = {c["key"] for c in rules["subtree"]["changes"] if c["action"] == "dropped"}
    assert dropped == {"head.fc.weight", "head.fc.bias"}
    assert [c["key"] for c in rules["keep-drop"]["changes"]] == ["1.num_batches_tracked"]
    assert len(rules["rename"]["changes"]) == len(expected)  # JSON lists every key


def test_text_report_shows_first_changes_and_a_count(run, det, tmp_path):
    result = run("normalize", det["det"], tmp_path / "bb.pth", "--subtree", "backbone")
    assert result.exit_code == 0, result.stderr
    assert "subtree: kept 7 keys under backbone., dropped 2" in result.stdout
    assert "backbone.0.weight -> 0.weight" in result.stdout
    assert "… and 4 more (--format json lists all)" in result.stdout


def test_recipe_toml_and_json_give_the_same_file_and_record_the_sha(run, det, tmp_path):
    outs = []
    for kind in ("toml", "json"):
        out = tmp_path / f"{kind}.safetensors"
        result = run("normalize", det["det"], out, "--map", det[kind])
        assert result.exit_code == 0, result.stderr
        assert f"map: recipe sha256 {load_recipe(det[kind]).sha256}" in result.stdout
        with safe_open(out, "pt") as f:
            assert f.metadata()[KEY_MAP_SHA256] == load_recipe(det[kind]).sha256
            outs.append({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    assert outs[0].keys() == outs[1].keys() == {"stage0.weight", "stage0.bias", "stage1.weight",
                                                "stage1.bias", "stage1.running_mean",
                                                "stage1.running_var"}
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])


def test_a_manifest_written_by_normalize_records_the_recipe_it_was_made_with(run, det,
                                                                            tmp_path):
    """Like the output's metadata and the report; its options stay those that reproduce
    the output (identity), so checking the output against it applies no step twice."""
    out, made = tmp_path / "o.safetensors", tmp_path / "m.json"
    result = run("normalize", det["det"], out, "--map", det["toml"], "--manifest", made,
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    sha = load_recipe(det["toml"]).sha256
    assert json.loads(result.stdout)["map_sha256"] == sha
    assert json.loads(made.read_text())["made_with"] == {"map": {"path": str(det["toml"]),
                                                                 "sha256": sha}}
    assert load_manifest(made).made_with["map"]["sha256"] == sha
    assert run("check", out, "--against-manifest", made).exit_code == 0
    run("normalize", det["det"], tmp_path / "p.safetensors", "--manifest", tmp_path / "n.json")
    assert "made_with" not in json.loads((tmp_path / "n.json").read_text())


def test_library_keywords_match_the_cli(det):
    via_options = ckptport.load_state_dict(det["det"], options=NormalizeOptions(
        subtree="backbone", drop=("*.num_batches_tracked",), rename=((r"^(\d+)\.", r"stage\1."),)))
    via_map = ckptport.load_state_dict(det["det"], map=det["toml"])
    assert list(via_options) == list(via_map)
    assert all(torch.equal(via_options[k], via_map[k]) for k in via_map)


# -- the documented order against a plain-Python reference ---------------------------------

PARTS = ["a", "b", "c", "0", "1", "w"]
KEYS = st.lists(st.lists(st.sampled_from(PARTS), min_size=2, max_size=4).map(".".join),
                min_size=1, max_size=12, unique=True)


@st.composite
def _globs(draw, keys):
    """Shell patterns made from the keys (so most match), now and then one that does not."""
    key = draw(st.sampled_from(keys))
    parts = key.split(".")
    star = draw(st.integers(0, len(parts)))
    pattern = ".".join(parts[:star]) + ("*" if star < len(parts) else "")
    return draw(st.sampled_from([pattern, f"*{parts[-1]}", "zz*"]))


@st.composite
def _renames(draw):
    """Whole-component swaps (collide often), group swaps, deletions of a first component."""
    old, new = draw(st.sampled_from(PARTS)), draw(st.sampled_from(PARTS))
    return draw(st.sampled_from([(rf"\b{old}\b", new), (r"^(\w)\.(\w)", r"\2.\1"),
                                 (rf"^{old}\.", ""), (r"\.(\d)$", r".n\1")]))


@st.composite
def _cases(draw):
    keys = draw(KEYS)
    subtree = draw(st.sampled_from([None, None, *sorted({k.split(".")[0] for k in keys}), "zz"]))
    keep = draw(st.lists(_globs(keys), max_size=2, unique=True))
    drop = draw(st.lists(_globs(keys), max_size=2, unique=True))
    renames = draw(st.lists(_renames(), max_size=3))
    return keys, subtree, keep, drop, renames


def _reference(keys, subtree, keep, drop, renames):
    """The documented order, written plainly: subtree, keep, drop, renames in turn.

    Returns ``[(new key, index of its original key)]``, or None where ckptport must
    refuse (a step that matches nothing, a collision).
    """
    out = [(k, i) for i, k in enumerate(keys)]
    if subtree:
        head = f"{subtree}."
        if not any(k.startswith(head) for k, _ in out):
            return None
        out = [(k[len(head):], i) for k, i in out if k.startswith(head) and len(k) > len(head)]
    for patterns, keeping in ((keep, True), (drop, False)):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(k, pattern) for k, _ in out):
                return None
        if patterns:
            out = [(k, i) for k, i in out
                   if any(fnmatch.fnmatchcase(k, p) for p in patterns) == keeping]
    for pattern, replacement in renames:
        if not any(re.search(pattern, k) for k, _ in out):
            return None
        new = [(re.sub(pattern, replacement, k), i) for k, i in out]
        if len({k for k, _ in new}) != len(new):
            return None  # a collision: two keys made one
        out = new
    return out


def _checkpoint(keys):
    state = OrderedDict((k, torch.tensor([float(i)])) for i, k in enumerate(keys))
    return Checkpoint(state, SourceFacts(Path("mem.pth"), Format.TORCH_ZIP, 0))


@settings(max_examples=400, deadline=None)
@given(case=_cases())
def test_steps_equal_the_plain_reference(case):
    keys, subtree, keep, drop, renames = case
    expected = _reference(keys, subtree, keep, drop, renames)
    options = NormalizeOptions(subtree=subtree, keep=tuple(keep), drop=tuple(drop),
                               rename=tuple(renames))
    checkpoint = _checkpoint(keys)
    try:
        for rule in key_rules(options.key_steps):
            checkpoint, _ = rule(checkpoint)
    except RuleError:
        assert expected is None
        return
    assert expected is not None
    state = checkpoint.tree
    assert [(k, int(v.item())) for k, v in state.items()] == expected


@settings(max_examples=200, deadline=None)
@given(keys=KEYS, data=st.data())
def test_a_rename_that_merges_two_keys_is_always_refused(keys, data):
    if len(keys) < 2:
        return
    first, second = data.draw(st.lists(st.sampled_from(keys), min_size=2, max_size=2,
                                       unique=True))
    options = NormalizeOptions(rename=((f"^(?:{re.escape(first)}|{re.escape(second)})$",
                                        "merged"),))
    (rule,) = key_rules(options.key_steps)
    with pytest.raises(RuleError, match="would merge"):
        rule(_checkpoint(keys))


def test_a_collision_names_both_keys(det):
    with pytest.raises(RuleError, match=r"merge 'backbone.0.weight' and 'backbone.1.weight'"):
        ckptport.load_state_dict(det["det"], rename=[(r"^backbone\.\d\.", "x.")])


# -- bad input: one line, exit 2, nothing written --------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--rename", "(", "x"], "--rename '(' 'x': missing ), unterminated subpattern"),
    (["--rename", "a", r"\3"], "invalid group reference 3"),
    (["--drop", "zzz*"], "--drop zzz*: matches no key (the keys' top-level prefixes are "
                         "backbone (7), head (2))"),
    (["--keep", "nope"], "--keep nope: matches no key"),
    (["--rename", "^zz", "y"], "--rename '^zz': matches no key"),
    (["--subtree", "model.backbone"], "--subtree model.backbone: no key starts with "
                                      "'model.backbone.'; the keys' top-level prefixes are "
                                      "backbone (7), head (2)"),
    (["--subtree", "backbone", "--map", "RECIPE"], "--map holds the key steps in its own "
                                                   "order"),
    (["--rename", r"(\w+\.?)+x", "y"], r"--rename '(\\w+\\.?)+x': can take exponential time"),
    (["--rename", "(a|ab)*c", "y"], "alternatives that may begin alike, inside a repeat"),
    (["--rename", r"(\w+)\.\1", "y"], "a backreference"),
])
def test_bad_steps_exit_2_one_line_nothing_written(run, det, tmp_path, args, message):
    args = [str(det["toml"]) if a == "RECIPE" else a for a in args]
    out = tmp_path / "out.pth"
    result = run("normalize", det["det"], out, *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, text, message", [
    ("bad.toml", 'steps = [\n  { subtree = "a" },\n  { drop = [ }\n]\n',
     "--map: not valid TOML: "),
    ("bad.json", '{"steps": [\n {"drop": "a*"},\n ]}', "--map: not valid JSON: line 3"),
    ("unknown.toml", 'steps = [{ subtree = "a" }, { strip = "b" }]',
     "--map: step 2: unknown step 'strip' (steps: subtree, keep, drop, rename)"),
    ("regex.toml", "steps = [{ rename = ['(', 'x'] }]",
     "--map: step 1: rename '(' 'x': missing ), unterminated subpattern"),
    ("pair.toml", "steps = [{ rename = 'x' }]", "--map: step 1: rename takes [PATTERN, "
                                                 "REPLACEMENT]"),
    ("shape.toml", 'subtree = "a"', "--map: a recipe holds one list, steps = [...]"),
    ("missing.toml", None, "--map: no such file"),
    ("nested.toml", "steps = " + "[" * 300 + "]" * 300, "--map: nested 300 levels deep"),
    ("nested.json", '{"steps": ' + "[" * 200_000 + "]" * 200_000 + "}",
     "--map: nested 200001 levels deep"),
    ("exponential.toml", "steps = [{ rename = ['^(a+)+$', 'x'] }]",
     "--map: step 1: rename '^(a+)+$': can take exponential time"),
])
def test_bad_recipe_exit_2_names_the_file(run, det, tmp_path, name, text, message):
    recipe = tmp_path / name
    if text is not None:
        recipe.write_text(text)
    out = tmp_path / "out.pth"
    result = run("normalize", det["det"], out, "--map", recipe)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ckptport: error: {recipe}: "), result.stderr
    assert message in lines[0]
    assert not out.exists()


def test_a_recipe_rename_may_have_an_empty_replacement(run, det, tmp_path):
    """The usual prefix strip, ``rename = ['^module\\.', '']``, as the CLI takes it."""
    recipe = tmp_path / "strip.toml"
    recipe.write_text("steps = [{ rename = ['^module\\.', ''] }]\n")
    out = tmp_path / "out.pth"
    result = run("normalize", det["det"], out, "--keep-prefixes", "--map", recipe)
    assert result.exit_code == 0, result.stderr
    assert list(_loaded(out)) == list(_detector_state())
    empty_pattern = tmp_path / "empty.toml"
    empty_pattern.write_text("steps = [{ rename = ['', 'x'] }]\n")
    assert run("normalize", det["det"], tmp_path / "o2.pth", "--map", empty_pattern
               ).exit_code == 2


# patterns people write in recipes, each renaming what re.sub would: (pattern, replacement)
ORDINARY = [
    (r"^module\.", ""), (r"^(?:module\.|model\.)+", ""), (r"_orig_mod\.", ""),
    (r"(.*)\.weight", r"\1.w"), (r"^(.*)\.weight$", r"\1.w"), (r"\.(weight|bias)$", r".p_\1"),
    (r"^blocks\.(\d+)\.", r"layers.\1."), (r"(?:\w+\.)+weight", r"<\g<0>>"),
    (r"^(?:[^.]+\.)*weight$", r"<\g<0>>"), (r"(.*)\.(.*)\.weight", r"\2.\1"),
    (r"encoder|decoder", "coder"),
    (r"(?i)^Backbone\.", "bb."), (r"^(?P<l>layers\.\d+)\.", r"\g<l>/"), (r"\bbias\b", "b"),
    (r"(?<=\.)weight$", "w"), (r"a.*?b", r"<\g<0>>"),
]


@pytest.mark.parametrize(("pattern", "replacement"), ORDINARY)
def test_ordinary_rename_patterns_rename_as_re_sub(pattern, replacement):
    keys = ["module.backbone.0.weight", "model.layers.12.attn.bias", "blocks.3.mlp.weight",
            "encoder.a.b.weight", "Backbone.x", "layers.7.norm.weight", "_orig_mod.fc.bias"]
    options = NormalizeOptions(rename=((pattern, replacement),), keep_prefixes=True)
    (rule,) = key_rules(options.key_steps, require_match=False)
    checkpoint, _ = rule(_checkpoint(keys))
    want = [re.sub(pattern, replacement, k) for k in keys]
    assert list(checkpoint.tree) == want


@pytest.mark.parametrize(("pattern", "degree"), [
    (r"^module\.", 1), (r"^(.*)\.weight$", 1), (r"^(?:[^.]+\.)*weight$", 1), (r"layers\.\d+", 1),
    (r"(.*)\.weight", 2), (r"(?:\w+\.)+weight", 2), (r"^(.*)(.*)x", 2), (r"(.*)\.(.*)\.weight", 3),
    (r"(.*)(.*)(.*)x", 4),
])
def test_a_patterns_cost_is_read_from_its_structure(pattern, degree):
    """The degree D of n^D matching steps on an n-character key, from the parsed pattern:
    repeats that compete with what follows them, and unanchored search."""
    from ckptport.rules.patterns import STEPS, cost

    found = cost(pattern)
    assert found.degree == degree
    assert found.longest() ** degree <= STEPS * 1.01


@pytest.mark.parametrize("pattern", [
    r"(a+)+$", r"(a*)*b", r"(a|a)*", r"(a|ab)*c", r"(\w+)\1", r"(x\w+)+$", r"(\w+\.?)+x",
    r"((ab)*)*", r"(.*a){20}", r"(?:a+)+", r"(?:\d|\d\w)+!", r"([a-z]+[0-9]*)+:",
])
def test_exponential_patterns_are_refused_before_any_key(pattern):
    """Each of these backtracks exponentially on a key that almost matches."""
    with pytest.raises(RuleError, match="can take exponential time"):
        NormalizeOptions(rename=((pattern, "x"),))


def test_a_key_too_long_for_a_costly_pattern_is_refused_naming_it():
    """(.*)\\.(.*)\\.weight is n^3: renamed on keys of up to 464 characters; the anchored
    equivalent is linear and renames any key."""
    keys = ["a.b.weight", "x" * 2000 + ".y.bias"]
    (rule,) = key_rules(NormalizeOptions(rename=((r"(.*)\.(.*)\.weight", r"\2"),)).key_steps)
    with pytest.raises(RuleError, match="a name of 2007 characters .* of at most 464"):
        rule(_checkpoint(keys))
    (rule,) = key_rules(NormalizeOptions(rename=((r"^([^.]*)\.([^.]*)\.weight$", r"\2"),)
                                         ).key_steps)
    renamed, _ = rule(_checkpoint(keys))
    assert list(renamed.tree) == ["b", keys[1]]
    versioned = _checkpoint(keys[:1])  # a module path of _metadata is renamed like a key
    versioned.tree._metadata = OrderedDict([("", {}), ("m" * 2000, {"version": 1})])
    (rule,) = key_rules(NormalizeOptions(rename=((r"(.*)\.(.*)\.weight", r"\2"),)).key_steps)
    with pytest.raises(RuleError, match="a name of 2000 characters"):
        rule(versioned)


def test_python_310_reads_json_recipes_and_says_why_not_toml(det, monkeypatch):
    monkeypatch.setattr("sys.version_info", (3, 10, 14))
    assert load_recipe(det["json"]).steps[0].args == ("backbone",)
    with pytest.raises(RuleError, match=r"TOML recipes need Python 3.11\+ \(tomllib\); write "
                                        "the recipe as JSON"):
        load_recipe(det["toml"])


def test_invalid_toml_names_the_line(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('steps = [\n  { subtree = "a" },\n  { drop = [ }\n]\n')
    with pytest.raises(RuleError, match=r"line 3"):
        load_recipe(recipe)


# -- manifests and diff ------------------------------------------------------------------


def test_manifest_with_steps_equals_manifest_of_the_normalized_file(run, det, tmp_path):
    steps = ["--subtree", "backbone", "--drop", "*.num_batches_tracked"]
    direct = run("manifest", det["det"], *steps)
    assert direct.exit_code == 0, direct.stderr
    out = tmp_path / "bb.safetensors"
    assert run("normalize", det["det"], out, *steps).exit_code == 0
    after = run("manifest", out)
    made, other = json.loads(direct.stdout), json.loads(after.stdout)
    assert made["digest"] == other["digest"]
    assert made["options"]["subtree"] == "backbone"
    assert made["options"]["drop"] == ["*.num_batches_tracked"]
    assert "subtree" not in other["options"]  # unused options are not recorded


def test_normalize_manifest_checks_its_own_output(run, det, tmp_path):
    out, manifest = tmp_path / "bb.pth", tmp_path / "m.json"
    assert run("normalize", det["det"], out, "--map", det["toml"], "--manifest",
               manifest).exit_code == 0
    result = run("check", out, "--against-manifest", manifest, "--codes", "CKP010")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "map" not in json.loads(manifest.read_text())["options"]


def test_manifest_records_the_recipe_and_check_reapplies_it(run, det, tmp_path):
    manifest = tmp_path / "m.json"
    assert run("manifest", det["det"], "--map", det["toml"], "-o", manifest).exit_code == 0
    recorded = json.loads(manifest.read_text())["options"]["map"]
    assert recorded["sha256"] == load_recipe(det["toml"]).sha256
    assert recorded["steps"][0] == {"subtree": "backbone"}
    det["toml"].rename(det["toml"].with_suffix(".moved"))  # the manifest needs no file
    try:
        result = run("check", det["det"], "--against-manifest", manifest, "--codes", "CKP010")
    finally:
        det["toml"].with_suffix(".moved").rename(det["toml"])
    assert result.exit_code == 0, result.stdout + result.stderr
    loaded = ckptport.analysis.manifests.load_manifest(manifest)
    assert ckptport.analysis.manifests.manifest_options(loaded).key_steps[0].args == ("backbone",)


def test_diff_applies_a_map_to_one_side(run, det, tmp_path):
    out = tmp_path / "bb.pth"
    assert run("normalize", det["det"], out, "--map", det["toml"]).exit_code == 0
    plain = run("diff", det["det"], out)
    assert plain.exit_code == 1
    mapped = run("diff", det["det"], out, "--map-a", det["toml"])
    assert mapped.exit_code == 0, mapped.stdout
    assert "6 tensors compared: 6 equal, 0 differ" in mapped.stdout
    both = run("diff", det["det"], out, "--map-a", det["toml"], "--subtree", "x")
    assert both.exit_code == 2 and "--map-a/--map-b" in both.stderr


# -- source metadata ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kohya(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A safetensors file with its own metadata, and ckptport keys it claims (never taken)."""
    path = tmp_path_factory.mktemp("meta") / "lora.safetensors"
    tensors = {f"lora_unet_{i}.alpha": torch.full((4, 4), float(i)) for i in range(3)}
    save_file(tensors, path, metadata={
        "format": "np", "ss_network_dim": "4", "modelspec.title": "tiny",
        "ckptport.source_sha256": "f" * 64, "ckptport.rules": "{}"})
    return path


def _metadata(path: Path) -> dict[str, str]:
    with safe_open(path, "pt") as f:
        return dict(f.metadata())


def test_source_metadata_is_carried_except_format_and_ckptport_keys(run, kohya, tmp_path):
    out = tmp_path / "out.safetensors"
    result = run("normalize", kohya, out)
    assert result.exit_code == 0, result.stderr
    meta = _metadata(out)
    assert meta["ss_network_dim"] == "4" and meta["modelspec.title"] == "tiny"
    assert meta["format"] == "pt"
    assert meta["ckptport.source_sha256"] != "f" * 64  # the real hash of what was read
    assert "metadata: carried the source's modelspec.title, ss_network_dim" in result.stdout
    dropped = tmp_path / "dropped.safetensors"
    assert run("normalize", kohya, dropped, "--metadata", "drop").exit_code == 0
    assert not {"ss_network_dim", "modelspec.title"} & set(_metadata(dropped))


def test_every_shard_carries_the_source_metadata(run, kohya, tmp_path):
    folder = tmp_path / "set"
    result = run("normalize", kohya, folder, "--max-shard-size", "100B", "--format", "json")
    assert result.exit_code == 0, result.stderr
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) == 3
    assert all(_metadata(s)["ss_network_dim"] == "4" for s in shards)
    assert json.loads(result.stdout)["metadata_kept"] == ["modelspec.title", "ss_network_dim"]


# -- tied names the hub leaves out ------------------------------------------------------------


@pytest.fixture(scope="session")
def tied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A training .pth with lm_head tied to the embedding, and its hub-style twin."""
    folder = tmp_path_factory.mktemp("tied")
    torch.manual_seed(1)
    wte = torch.randn(8, 4)
    state = {"transformer.wte.weight": wte, "lm_head.weight": wte,
             "transformer.ln.weight": torch.ones(4)}
    torch.save(state, folder / "train.pth")
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"},
              folder / "model.safetensors", metadata={"format": "pt"})
    save_file({"transformer.wte.weight": wte}, folder / "short.safetensors",
              metadata={"format": "pt"})
    return {"pth": folder / "train.pth", "hub": folder / "model.safetensors",
            "short": folder / "short.safetensors"}


def test_manifest_check_and_diff_agree_on_tied_names(run, tied, tmp_path):
    manifest = tmp_path / "m.json"
    assert run("manifest", tied["pth"], "-o", manifest).exit_code == 0
    check = run("check", tied["hub"], "--against-manifest", manifest, "--codes", "CKP010")
    assert check.exit_code == 0, check.stdout
    by_manifest = run("diff", manifest, tied["hub"], "--format", "json")
    by_file = run("diff", tied["pth"], tied["hub"], "--format", "json")
    for result in (by_manifest, by_file):
        assert result.exit_code == 0, result.stdout
        report = json.loads(result.stdout)
        assert report["tied_only_in_a"] == ["lm_head.weight"] and report["only_in_a"] == []
    # a name that is not tied to a tensor the artifact holds is still missing
    short = run("check", tied["short"], "--against-manifest", manifest, "--codes", "CKP010")
    assert short.exit_code == 1
    assert "transformer.ln.weight" in short.stdout and "lm_head.weight" not in short.stdout


# -- --hash-name ------------------------------------------------------------------------------


def test_hash_name_is_what_torch_hub_verifies(run, det, tmp_path):
    out = tmp_path / "resnet.pth"
    result = run("normalize", det["det"], out, "--subtree", "backbone", "--hash-name")
    assert result.exit_code == 0, result.stderr
    (final,) = tmp_path.iterdir()  # no temp file, no unhashed DST
    assert re.fullmatch(r"resnet-[0-9a-f]{8}\.pth", final.name)
    assert f"wrote {final} " in result.stdout
    hub = tmp_path / "hub"
    state = torch.hub.load_state_dict_from_url(final.as_uri(), model_dir=str(hub),
                                               check_hash=True, progress=False)
    assert torch.equal(state["0.weight"], _detector_state()["backbone.0.weight"])
    again = run("normalize", det["det"], out, "--subtree", "backbone", "--hash-name")
    assert again.exit_code == 2 and "exists; pass --overwrite" in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, "hub"])


def test_hash_name_refuses_a_shard_set(run, det, tmp_path):
    result = run("normalize", det["det"], tmp_path / "set", "--max-shard-size", "1KB",
                 "--hash-name")
    assert result.exit_code == 2 and "--hash-name names one file" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_hash_name_refuses_a_name_the_hub_misreads_before_reading(run, det, tmp_path,
                                                                   monkeypatch):
    """``model-a.b.pth``: torch.hub would take ``a`` for the hash; refused up front."""
    import ckptport.readers as readers

    def no_read(*args, **kwargs):
        raise AssertionError("the source was read before the DST name was checked")

    monkeypatch.setattr(readers, "open_checkpoint", no_read)
    result = run("normalize", det["det"], tmp_path / "model-a.b.pth", "--hash-name")
    assert result.exit_code == 2 and "wrong part" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_folder_mode_takes_the_steps_and_refuses_hash_name(run, det, tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.pth", "sub/b.pth"):
        (folder / name).write_bytes(det["det"].read_bytes())
    out = tmp_path / "out"
    refused = run("normalize", folder, out, "--map", det["toml"], "--hash-name")
    assert refused.exit_code == 2 and "--hash-name" in refused.stderr and not out.exists()
    result = run("normalize", folder, out, "--map", det["toml"], "--jobs", "1")
    assert result.exit_code == 0, result.stdout + result.stderr
    for name in ("a.pth", "sub/b.pth"):
        assert list(_loaded(out / name)) == ["stage0.weight", "stage0.bias", "stage1.weight",
                                             "stage1.bias", "stage1.running_mean",
                                             "stage1.running_var"]
