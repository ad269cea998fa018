"""Every command and snippet in README.md and docs/*.md runs as written.

The contract a document's author keeps (README.md's "Development" section
points here):

- A `````bash`` block runs, in document order, in a working folder of its own
  per document that holds ``fixtures/ddp_cuda3.pth`` (a copy of the shipped
  fixture): what the root of a clone holds. Each line is one command (a line
  ending in ``\\`` continues it); it must exit 0, or the code its comment
  names: ``# exit 1``.
- ``make TARGET`` lines are not run: TARGET must be a target of the Makefile.
  ``pip install`` lines are not run: every ``.[extra]`` they name must be an
  extra of pyproject.toml.
- A block right after ``<!-- doc-test: script -->`` runs as one bash script
  (``set -e``); after ``<!-- doc-test: skip -->`` it is an illustration and
  does not run (say why in the text).
- A `````python`` block runs in the same folder, in one namespace per document,
  so a later block may use what an earlier one made.
- Every relative link leads to a file, and its ``#anchor`` to a heading.
- Every test a document names (```tests/test_x.py::test_name```) exists.
- Every ``--option`` of a ``ckptport COMMAND`` line in any block (yaml
  included), and in the first cell of a table under a heading that names
  ``ckptport COMMAND``, is an option of that command's ``--help``.

Plain ``ckptport`` lines run in this process (through click, as
``tests/conftest.py``'s ``run`` does) so the whole check stays fast; other
lines run in bash with ``ckptport`` and ``python`` on PATH.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ckptport.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FIXTURE = ROOT / "fixtures" / "ddp_cuda3.pth"
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(script|skip)\b.*-->\s*$")
EXPECT = re.compile(r"#\s*exit (\d+)\b")
SHELL_SYNTAX = re.compile(r"[|&;<>$`()*?]")
HEADING = re.compile(r"^(#+)\s")
COMMAND = re.compile(r"\bckptport (normalize|diff|inspect|check|manifest|sign|verify)\b(.*)")


@dataclass(frozen=True)
class Block:
    language: str
    marker: str | None  # "script", "skip" or None
    line: int  # of the first line of code, 1-based
    code: str


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown text, with the doc-test marker right above each."""
    found, lines = [], text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.match(above.strip())
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        found.append(Block(opening.group(1), marker.group(1) if marker else None, index + 2,
                           "\n".join(lines[index + 1:end])))
        index = end + 1
    return found


def commands(code: str) -> list[tuple[int, str]]:
    """A bash block's commands with their line offsets; a trailing ``\\`` continues a line."""
    result, pending, start = [], "", 0
    for offset, line in enumerate(code.splitlines()):
        if not pending:
            start = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full and not full.startswith("#"):
            result.append((start, full))
    return result


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.MULTILINE)}


def extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def options_of(command: str) -> set[str]:
    names = {"--help", "-h"}
    for param in cli.commands[command].params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def unknown_options(line: str) -> list[str]:
    """The ``--options`` of a ``ckptport COMMAND`` line that COMMAND does not have."""
    match = COMMAND.search(line)
    if match is None:
        return []
    command, rest = match.groups()
    rest = rest.split(" #", 1)[0]
    known = options_of(command)
    return [o for o in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest) if o not in known]


class Workspace:
    """The folder a document's examples run in, and how they run there."""

    def __init__(self, folder: Path, shims: Path, module: types.ModuleType) -> None:
        self.folder = folder
        self.env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.namespace = module.__dict__  # a real module: dataclasses look their module up

    def shell(self, command: str) -> tuple[int, str]:
        """Exit code and output of ``command``, run in this folder."""
        if command.startswith("ckptport ") and not SHELL_SYNTAX.search(command.split(" #")[0]):
            args = shlex.split(command, comments=True)[1:]
            result = CliRunner().invoke(cli, args, catch_exceptions=False)
            return result.exit_code, result.output
        done = subprocess.run(["bash", "-c", command], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr

    def python(self, code: str, where: str) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, where, "exec"), self.namespace)  # noqa: S102 (our own docs)


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ckptport`` and ``python`` on PATH: this checkout run by this interpreter."""
    folder = tmp_path_factory.mktemp("bin")
    for name, target in (("ckptport", f'"{sys.executable}" -m ckptport'),
                         ("python", f'"{sys.executable}"')):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)
    return folder


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_example_runs_as_written(document: Path, tmp_path: Path, shims: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fixtures").mkdir()
    shutil.copyfile(FIXTURE, tmp_path / "fixtures" / FIXTURE.name)
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("__doc_example__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    space = Workspace(tmp_path, shims, module)
    name = document.relative_to(ROOT).as_posix()
    failures = []
    for block in blocks(document.read_text()):
        where = f"{name}:{block.line}"
        if block.marker == "skip" or block.language not in ("bash", "python"):
            continue
        if block.language == "python":
            space.python(block.code, where)
            continue
        if block.marker == "script":
            code, output = space.shell(f"set -e\n{block.code}")
            if code:
                failures.append(f"{where}: the script exited {code}:\n{output[-2000:]}")
            continue
        for offset, command in commands(block.code):
            at = f"{name}:{block.line + offset}"
            if command.startswith("make "):
                target = next(w for w in command.split()[1:] if "=" not in w)
                if target not in makefile_targets():
                    failures.append(f"{at}: no Makefile target {target!r}")
                continue
            if command.startswith("pip install"):
                for word in shlex.split(command, comments=True):
                    named = re.fullmatch(r"\.\[([\w,-]+)\]", word)
                    if named and not set(named.group(1).split(",")) <= extras():
                        failures.append(f"{at}: pyproject.toml has no extra {word!r}")
                continue
            expected = int(m.group(1)) if (m := EXPECT.search(command)) else 0
            code, output = space.shell(command)
            if code != expected:
                failures.append(f"{at}: {command!r} exited {code}, the document says "
                                f"{expected}:\n{output[-2000:]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_option_named_is_one_the_command_has(document: Path) -> None:
    text = document.read_text()
    wrong = [f"line {block.line}: {option}" for block in blocks(text)
             for line in block.code.splitlines() for option in unknown_options(line)]
    levels: list[tuple[int, str | None]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            levels = [(lv, c) for lv, c in levels if lv < level]
            named = COMMAND.search(line)
            levels.append((level, named.group(1) if named else None))
            continue
        command = next((c for _, c in reversed(levels) if c), None)
        if command and line.startswith("|"):
            first = line.split("|")[1]
            known = options_of(command)
            wrong += [f"line {number}: {command} {option}" for option in
                      re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", first) if option not in known]
    assert not wrong, f"{document.name} names options that --help does not list:\n" + \
        "\n".join(wrong)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_test_named_exists(document: Path) -> None:
    """A guarantee names its test as ``tests/FILE.py`` or ``tests/FILE.py::test_name``."""
    missing = []
    for file, name in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", document.read_text()):
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
        elif name and not re.search(rf"^def {name}\(", path.read_text(), re.MULTILINE):
            missing.append(f"{file}::{name}")
    assert not missing, f"{document.name} names tests that do not exist: {missing}"


def anchors(document: Path) -> set[str]:
    """The anchors GitHub makes of a document's headings."""
    slugs = set()
    for line in document.read_text().splitlines():
        if HEADING.match(line):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return slugs


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_leads_somewhere(document: Path) -> None:
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", document.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path = (document.parent / target) if target else document
        if not path.exists():
            broken.append(target)
        elif anchor and anchor not in anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{document.name} links to what does not exist: {broken}"


def test_the_rules_see_what_they_check() -> None:
    """The parser itself: fences, markers, continuations, expected codes, unknown options."""
    text = ("<!-- doc-test: skip -->\n```bash\nrm -rf /\n```\n\n```bash\na \\\n  b # exit 1\n"
            "# note\nc\n```\n")
    found = blocks(text)
    assert [(b.language, b.marker, b.line) for b in found] == [("bash", "skip", 3),
                                                               ("bash", None, 7)]
    assert commands(found[1].code) == [(0, "a    b # exit 1"), (3, "c")]
    assert EXPECT.search("ckptport check x   # exit 1: findings").group(1) == "1"
    assert unknown_options("ckptport check x --select CKP001 --nope # --also") == ["--nope"]
