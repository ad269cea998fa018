"""The extension points: a reader, a rule, a writer, a check code and a report format each
take one class plus one registration, and nothing else in ckptport changes.

Each test registers a small one (with ``monkeypatch``, so the registry is
restored) and runs the real command through it; the README's Architecture
section points here.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch

import ckptport
import ckptport.commands.check as check_module
import ckptport.readers as readers
import ckptport.render as render
import ckptport.writers.formats as formats
from ckptport.checkpoint import Checkpoint, Format, SourceFacts
from ckptport.dtypes import by_name
from ckptport.errors import OutputError
from ckptport.rules import Change, NormalizeOptions, RuleResult, build_rules
from ckptport.tensors import Blob, StorageInfo, TensorInfo, contiguous_strides
from tests.helpers import same_bits

TOY_MAGIC = b"TOYW"


def _toy_file(path: Path, values: list[float]) -> Path:
    """A toy container: magic, a count, then float32 values (one tensor named ``w``)."""
    path.write_bytes(TOY_MAGIC + struct.pack("<I", len(values))
                     + struct.pack(f"<{len(values)}f", *values))
    return path


class ToyReader:
    """A reader for the toy container: it names its own format and claims by bytes."""

    format = Format("toy-weights")

    def claims(self, source: readers.Source) -> bool:
        return source.file is not None and source.file.read(0, 4) == TOY_MAGIC

    def load(self, source: readers.Source, options: readers.ReadOptions) -> Checkpoint:
        assert source.file is not None
        (count,) = struct.unpack("<I", source.file.read(4, 4))
        dtype = by_name("float32")
        assert dtype is not None
        storage = StorageInfo("0", "cpu", dtype, 4 * count, Blob(source.file, 8, 4 * count))
        tensor = TensorInfo(dtype, (count,), contiguous_strides((count,)), 0, storage)
        return Checkpoint({"w": tensor}, SourceFacts(source.main, self.format, source.file.size))


def test_a_reader_is_one_class_and_one_registration(monkeypatch, tmp_path, run):
    monkeypatch.setattr(readers, "READERS", (*readers.READERS, ToyReader()))
    src = _toy_file(tmp_path / "weights.toy", [1.0, -2.5, 3.0])
    out = tmp_path / "out.safetensors"
    assert ckptport.normalize_file(src, out).output.verified
    assert same_bits(ckptport.load_state_dict(out)["w"], torch.tensor([1.0, -2.5, 3.0]))
    shown = run("inspect", src, "--format", "json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["format"] == "toy-weights"
    gated = run("check", src, "--require-format", "safetensors", "--format", "json")
    assert "format toy-weights" in gated.stdout


class ToySetReader:
    """A layout: a folder holding ``toy.set`` and parts ``*.toy``, one checkpoint whose
    tensors are the parts; it knows its names and its files, and nothing else lists them."""

    format = Format("toy-set")

    def layout(self, folder: Any, names: Any, name: str | None, tag: str | None
               ) -> readers.Layout | None:
        if names is None or "toy.set" not in names:
            return None
        parts = tuple(folder / n for n in sorted(names) if n.endswith(".toy"))
        return readers.Layout(folder, (folder / "toy.set", *parts), self, self.format)

    def load(self, source: readers.Source, options: readers.ReadOptions) -> Checkpoint:
        from ckptport.sources import open_source

        tree = {}
        for path in source.files[1:]:
            part = readers.Source(path, path, (path,), None, open_source(path))
            tree[path.stem] = ToyReader().load(part, options).tree["w"]
        size = sum(p.stat().st_size for p in source.files)
        return Checkpoint(tree, SourceFacts(source.main, self.format, size, files=source.files))


def test_a_layout_is_one_class_and_one_registration(monkeypatch, tmp_path, run):
    monkeypatch.setattr(readers, "READERS", (ToySetReader(), *readers.READERS))
    root = tmp_path / "runs"
    folder = root / "toyset"
    folder.mkdir(parents=True)
    (folder / "toy.set").write_text("two parts")
    _toy_file(folder / "a.toy", [1.0, 2.0])
    _toy_file(folder / "b.toy", [-3.0])
    out = tmp_path / "out.safetensors"
    report = ckptport.normalize_file(folder, out)
    assert report.output.verified
    assert report.source.files == (folder / "toy.set", folder / "a.toy", folder / "b.toy")
    loaded = ckptport.load_state_dict(out)
    assert same_bits(loaded["a"], torch.tensor([1.0, 2.0]))
    assert same_bits(loaded["b"], torch.tensor([-3.0]))
    shown = run("inspect", folder, "--format", "json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["format"] == "toy-set"
    gated = json.loads(run("check", root, "--format", "json").stdout)  # the folder walk
    assert [f["path"] for f in gated["files"]] == [str(folder)] and not gated["skipped"]
    done = run("normalize", root, tmp_path / "converted")  # folder mode
    assert done.exit_code == 0, done.output
    assert same_bits(ckptport.load_state_dict(tmp_path / "converted" / "toyset.pth")["b"],
                     torch.tensor([-3.0]))
    assert run("diff", folder, out).exit_code == 0


@dataclass(frozen=True)
class Negate:
    """A rule: it returns the new checkpoint and what it changed."""

    name: str = "negate"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        tree = {k: -v for k, v in ckptport.readers.materialize(checkpoint).tree.items()}
        changes = tuple(Change(k, "negated", "x -> -x") for k in tree)
        return checkpoint.with_tree(tree), RuleResult(self.name, changes, "negated")


def test_a_rule_is_one_class_and_one_place_in_the_list(fx):
    rules = [*build_rules(NormalizeOptions()), Negate()]
    result = ckptport.normalize(ckptport.read(fx["plain"]), rules=rules)
    assert result.result("negate") is not None and result.result("negate").changed
    original = ckptport.load_state_dict(fx["plain"])
    assert all(same_bits(result.checkpoint.tree[k], -v) for k, v in original.items())


class JsonLinesFile:
    """A file format: write a tree into an open file, then check what was written."""

    def write(self, tree: Any, file: BinaryIO, dst: Path, options: Any, advance: Any) -> int:
        from ckptport.tensors import to_numpy

        lines = [json.dumps({"key": k, "values": to_numpy(v).tolist()}) for k, v in tree.items()]
        file.write("\n".join(lines).encode())
        return len(lines)

    def verify(self, path: Path, tree: Any, written: int, options: Any, advance: Any) -> None:
        if not len(path.read_text().splitlines()) == written == len(tree):
            raise ckptport.VerificationError("lines lost", path)


def test_an_output_format_is_one_class_and_one_registration(monkeypatch, fx, run, tmp_path):
    # formats.register(...) in a module of its own; here through monkeypatch, so it is undone
    monkeypatch.setitem(formats.FORMATS, "jsonl",
                        formats.OutputFormat("jsonl", formats.Kind.FILE, JsonLinesFile,
                                             (".jsonl",)))
    out = tmp_path / "weights.jsonl"
    result = run("normalize", fx["plain"], out)
    assert result.exit_code == 0, result.stderr
    assert "(jsonl, " in result.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    original = ckptport.load_state_dict(fx["plain"])
    assert [r["key"] for r in rows] == list(original)
    assert rows[0]["values"] == original[rows[0]["key"]].tolist()
    assert run("normalize", fx["plain"], tmp_path / "w.bin", "--to", "jsonl").exit_code == 0


def test_an_unknown_or_impossible_output_format_is_an_error_naming_it(fx, tmp_path):
    checkpoint = ckptport.read(fx["plain"])
    with pytest.raises(OutputError, match="unknown output format 'onnx'"):
        ckptport.write(checkpoint, tmp_path / "x.bin", to="onnx")
    with pytest.raises(OutputError, match="a dcp checkpoint is a folder"):
        ckptport.write(checkpoint, tmp_path / "x.bin", to="dcp")
    ckptport.write(checkpoint, tmp_path / "dcp", to="dcp")  # a folder: written, verified
    assert (tmp_path / "dcp" / ".metadata").is_file()
    assert not (tmp_path / "x.bin").exists()


def _odd_sized(file: check_module.FileUnderCheck) -> Any:
    for key, tensor in file.checkpoint.tensors():
        if tensor.numel() % 2:
            yield ".".join(map(str, key)), f"{tensor.numel()} elements, an odd number"


def test_a_check_code_is_one_function_and_one_entry(monkeypatch, fx, run):
    code = check_module.CheckCode("CKP900", "odd-sized", "warning", "tensors of odd size",
                                  "a toy", "none", _odd_sized)
    monkeypatch.setitem(check_module.CODES, "CKP900", code)
    report = ckptport.check(fx["plain"], codes=["CKP900"])
    assert report.findings and {f.code for f in report.files[0].findings} == {"CKP900"}


class CsvFormatter:
    """A report format: a name, the commands it renders, a method per report."""

    name = "csv"
    commands = frozenset({"check"})

    def check(self, report: Any) -> str:
        return "\n".join(f"{f.code},{f.path.name},{f.key or ''}"
                         for r in report.files for f in r.findings)


def test_a_report_format_is_one_class_and_one_entry(monkeypatch, fx):
    monkeypatch.setattr(render, "FORMATTERS", (*render.FORMATTERS, CsvFormatter()))
    assert "csv" in render.formats_for("check") and "csv" not in render.formats_for("diff")
    text = render.formatter("csv").check(ckptport.check(fx["ddp_cuda3"]))
    assert text.splitlines()[0].startswith("CKP001,ddp_cuda3.pth,")
