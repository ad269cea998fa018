"""One truth per file: ckptport's readers and torch's agree, or the file is refused.

Over every fixture, every hostile-corpus file and every past fuzz finding:
the tensors (names, dtypes, shapes, bytes) that the torch-free path sees
(``inspect``/``check``: a lenient description), that the strict read sees,
that ``normalize --select all`` writes, and that ``torch.load(weights_only=
False)`` / ``safetensors.torch.load_file`` load must be the same. A file the
strict reader refuses is never given to torch (it may run code); a file it
accepts, and that ``check`` does not flag as code-running, is, in one
throwaway subprocess, and the session's sentinel must never appear.
"""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptport
from ckptport.errors import CkptportError
from ckptport.readers import open_checkpoint
from ckptport.tensors import chunks
from ckptport.tree import ObjectRecord, format_path, iter_nodes, iter_tensors

Entry = tuple[str, tuple[int, ...], str]  # dtype, shape, sha256 of the canonical bytes

_TORCH_VIEW = r"""
import hashlib, json, sys, warnings
import torch
warnings.simplefilter("ignore")

def digest(t):
    t = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()

def flat(x, prefix, out):
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_quantized:
            out["<exotic>"] = ["", [], ""]
        else:
            dtype = str(x.dtype).removeprefix("torch.")
            out[prefix or "<root>"] = [dtype, list(x.shape), digest(x)]
        return True
    if isinstance(x, dict):
        return all([flat(v, f"{prefix}.{k}" if prefix else str(k), out) for k, v in x.items()])
    if type(x) in (list, tuple):
        return all([flat(v, f"{prefix}.{i}" if prefix else str(i), out) for i, v in enumerate(x)])
    return x is None or type(x) in (int, float, str, bool, bytes, complex)

for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file
            value = load_file(path)
        else:
            value = torch.load(path, map_location="cpu", weights_only=False)
        out = {}
        plain = flat(value, "", out)
        print(json.dumps({"path": path, "tensors": out, "plain": plain}), flush=True)
    except BaseException as exc:
        print(json.dumps({"path": path, "error": type(exc).__name__}), flush=True)
"""


def _digest(leaf: Any) -> str:
    sha = hashlib.sha256()
    for piece in chunks(leaf):
        sha.update(piece)
    return sha.hexdigest()


def _ours(tree: Any) -> dict[str, Entry]:
    return {format_path(path): (str(leaf.dtype).removeprefix("torch."), tuple(leaf.shape),
                                _digest(leaf)) for path, leaf in iter_tensors(tree)}


def _has_records(tree: Any) -> bool:
    return any(isinstance(node, ObjectRecord) for _, node in iter_nodes(tree))


def _numpy_arrays(tree: Any) -> set[str]:
    """Where the file holds numpy arrays: convert-objects writes them as tensors."""
    return {format_path(path) for path, node in iter_nodes(tree)
            if type(node).__module__.split(".")[0] == "numpy"}


def _same(a: dict[str, Entry], b: dict[str, Entry], by_name: bool) -> bool:
    """Equal by name, or (where objects make names differ) as multisets of tensors."""
    return a == b if by_name else Counter(a.values()) == Counter(b.values())


def _candidates(fx: dict[str, Path], corpus: dict[str, Any]) -> list[Path]:
    paths = list(fx.values()) + [case.path for case in corpus.values()]
    paths += sorted((Path(__file__).parent / "corpus").glob("*.pth"))
    return [p for p in dict.fromkeys(paths) if stat.S_ISREG(p.lstat().st_mode)]


def _torch_views(paths: list[Path]) -> dict[str, dict[str, Any]]:
    if not paths:
        return {}
    done = subprocess.run([sys.executable, "-c", _TORCH_VIEW, *map(str, paths)],
                          capture_output=True, text=True, timeout=300, check=False)
    views = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        views[record["path"]] = record
    return views


@pytest.fixture(scope="module")
def accepted(fx, corpus, tmp_path_factory) -> list[tuple[Path, dict[str, Entry], bool, Path,
                                                         set[str]]]:
    """Files the strict reader accepts, with ckptport's view and its normalized output."""
    out_dir = tmp_path_factory.mktemp("agreement")
    found = []
    for index, path in enumerate(_candidates(fx, corpus)):
        try:
            strict = open_checkpoint(path)
        except CkptportError:
            continue
        described = open_checkpoint(path, lenient=True)
        ours = _ours(strict.tree)
        assert _ours(described.tree) == ours, f"{path.name}: inspect and read disagree"
        out = out_dir / f"{index}.pth"
        options = ckptport.NormalizeOptions(select="all", keep_prefixes=True)
        try:
            ckptport.normalize_file(path, out, options)
        except CkptportError as exc:  # a refusal of the conversion, not of the file
            assert "not a" not in str(exc) and "corrupt" not in str(exc), (path.name, exc)
            continue
        if strict.source.refused_globals or strict.source.unproven:
            continue  # named by check as code-running (an fx GraphModule): torch would run it
        found.append((path, ours, not _has_records(strict.tree), out,
                      _numpy_arrays(strict.tree)))
    return found


def test_the_files_ckptport_accepts_are_many(accepted):
    assert len(accepted) >= 30


def test_normalize_writes_what_inspect_sees(accepted):
    for path, ours, plain, out, arrays in accepted:
        written = torch.load(out, weights_only=True)
        theirs = {k: v for k, v in _ours(written).items() if k not in arrays}
        assert _same(ours, theirs, plain), path.name


def test_torch_loads_what_ckptport_reads(accepted, sentinel):
    views = _torch_views([path for path, *_ in accepted])
    compared = 0
    for path, ours, plain, _, _ in accepted:
        view = views.get(str(path))
        assert view is not None, f"{path.name}: the torch subprocess died on it"
        if "error" in view or "<exotic>" in view["tensors"]:
            continue  # torch cannot load it (unimportable classes): nothing to compare
        theirs = {k: (d, tuple(s), h) for k, (d, s, h) in view["tensors"].items()}
        assert _same(ours, theirs, plain and view["plain"]), path.name
        compared += 1
    assert compared >= 25
    assert not sentinel.exists(), "torch.load ran code from a file ckptport accepted"
