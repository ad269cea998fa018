"""Property-based tests over generated state dicts (hypothesis).

Random key trees with wrapper prefixes, every dtype safetensors stores,
0-dim and empty shapes, tied tensors, views of one buffer, non-contiguous
tensors and non-tensor leaves. Properties: a normalized file reads back bit
for bit (.pth and .safetensors, single and sharded), ``diff(x, x)`` is
equal, ``diff`` finds any single-element change, and normalizing an output
changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

import ckptport
from ckptport.compare import tree_mismatches
from ckptport.rules import strip_key
from ckptport.tree import KEY_RULES, KEY_SOURCE_SHA256
from tests.helpers import same_bits

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]
SEGMENTS = ["layer", "conv", "blocks", "0", "1", "attn", "proj", "norm", "weight", "bias"]
WRAPPERS = ["module.", "_orig_mod.", "module.module.", "_orig_mod.module.", ""]
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def _tensor(seed: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=gen, dtype=torch.float64) * 100
    if dtype == torch.bool:
        return values > 0
    return values.to(dtype)


@st.composite
def state_dicts(draw: Any) -> OrderedDict[str, Any]:
    names = draw(st.lists(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3)
                          .map(".".join), min_size=1, max_size=6, unique=True))
    state: OrderedDict[str, Any] = OrderedDict()
    made: list[torch.Tensor] = []
    for name in names:
        key = draw(st.sampled_from(WRAPPERS)) + name
        kind = draw(st.sampled_from(["plain", "plain", "tie", "view", "transposed"]))
        if kind == "tie" and made:
            state[key] = draw(st.sampled_from(made))
            continue
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        tensor = _tensor(draw(st.integers(0, 2**16)), dtype, shape)
        if kind == "view":
            base = _tensor(draw(st.integers(0, 2**16)), dtype, (20,))
            start = draw(st.integers(0, 10))
            tensor = base[start:start + draw(st.integers(0, 10))]
        elif kind == "transposed":
            tensor = _tensor(draw(st.integers(0, 2**16)), dtype, (3, 2)).t()
        made.append(tensor)
        state[key] = tensor
    return state


@st.composite
def checkpoints(draw: Any) -> dict[str, Any]:
    leaves = st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=True), st.text(max_size=5),
                       st.none(), st.booleans())
    extra = draw(st.dictionaries(st.sampled_from(["epoch", "lr", "note", "flag"]),
                                 st.one_of(leaves, st.lists(leaves, max_size=3),
                                           st.tuples(leaves, leaves)), max_size=3))
    return {"state_dict": draw(state_dicts()), **extra}


def _write_source(tree: Any, folder: Path) -> Path:
    path = folder / "src.pth"
    torch.save(tree, path)
    return path


def _expected(state: OrderedDict[str, Any]) -> dict[str, torch.Tensor]:
    return {strip_key(k): v for k, v in state.items()}


@PROPERTY_SETTINGS
@given(checkpoints(), st.sampled_from(["pth", "safetensors"]), st.booleans())
def test_normalized_output_reads_back_bit_for_bit(tree, ext, sharded):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = _write_source(tree, folder)
        dst = folder / ("set" if sharded else f"out.{ext}")
        ckptport.normalize_file(src, dst, to=ext if sharded else None,
                         max_shard_size=64 if sharded else None)
        expected = _expected(tree["state_dict"])
        if sharded:
            got = ckptport.read(dst).tree
        elif ext == "pth":
            got = torch.load(dst, weights_only=True)
        else:
            with safe_open(str(dst), framework="pt") as f:
                stored = {k: f.get_tensor(k) for k in f.keys()}
            got = ckptport.read(dst).tree
            assert all(same_bits(stored[k], got[k]) for k in stored)
        if sharded and ext == "safetensors":  # the hub's layout leaves tied names out
            dropped = set(expected) - set(got)
            assert all(any(expected[d] is expected[k] for k in got) for d in dropped)
            expected = {k: v for k, v in expected.items() if k not in dropped}
        assert set(got) == set(expected)
        for key, tensor in expected.items():
            assert same_bits(got[key], tensor), key


@PROPERTY_SETTINGS
@given(checkpoints())
def test_select_all_round_trips_the_whole_tree(tree):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = _write_source(tree, folder)
        options = ckptport.NormalizeOptions(select="all", keep_prefixes=True)
        normalized = ckptport.normalize(ckptport.read(src), options).checkpoint.tree
        for ext in ("pth", "safetensors"):
            out = folder / f"all.{ext}"
            ckptport.normalize_file(src, out, options)
            assert tree_mismatches(normalized, ckptport.read(out).tree) == []


@PROPERTY_SETTINGS
@given(state_dicts(), st.data())
def test_diff_is_equal_on_itself_and_finds_any_single_change(state, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = _write_source(state, folder)
        assert ckptport.diff(src, src).equal
        candidates = [k for k, v in state.items() if v.numel()]
        if not candidates:
            return
        key = data.draw(st.sampled_from(candidates))
        changed = OrderedDict((k, v.contiguous().clone()) for k, v in state.items())
        flat = changed[key].reshape(-1)
        index = data.draw(st.integers(0, flat.numel() - 1))
        # flip the lowest bit of one element: a change in every dtype (x + 1 can round to x)
        flat.view(torch.uint8)[index * flat.element_size()] ^= 1
        other = folder / "other.pth"
        torch.save(changed, other)
        report = ckptport.diff(src, other)
        assert not report.equal
        assert strip_key(key) in {d.key for d in report.value_mismatches}


@PROPERTY_SETTINGS
@given(checkpoints(), st.sampled_from(["pth", "safetensors"]))
def test_normalize_is_idempotent(tree, ext):
    """A second pass writes the same bytes; in safetensors only the provenance (the file
    read, the rules that changed something) differs, by design."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = _write_source(tree, folder)
        once, twice = folder / f"once.{ext}", folder / f"twice.{ext}"
        ckptport.normalize_file(src, once)
        report = ckptport.normalize_file(once, twice)
        assert not any(r.changed for r in report.rules)
        if ext == "pth":
            assert once.read_bytes() == twice.read_bytes()
            return
        first, second = _header_and_data(once), _header_and_data(twice)
        assert second[0][KEY_SOURCE_SHA256] == hashlib.sha256(once.read_bytes()).hexdigest()
        assert second[0][KEY_RULES] == "{}"
        for meta in (first[0], second[0]):
            del meta[KEY_SOURCE_SHA256], meta[KEY_RULES]
        assert first == second


def _header_and_data(path: Path) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    return header.pop("__metadata__"), header, raw[8 + size:]
