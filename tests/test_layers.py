"""The import contract docs/architecture.md promises, read from the source.

Every module of ``ckptport/`` is parsed with ``ast`` (no import runs); its
imports of ckptport modules, at any depth (function-level and
``TYPE_CHECKING`` ones too: they are the same dependency), are edges of a
graph over *rooms*: a top-level module (``tree``) or package (``readers``).
``LAYERS`` lists the rooms bottom to top; a room may import rooms of its own
layer or below, never above, and the rooms form no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

# Bottom to top. Adjust here when a room is added or moves (and say so in docs/architecture.md).
LAYERS: list[frozenset[str]] = [
    frozenset({"tree", "escape", "sealed", "progress", "parallel", "_version"}),
    frozenset({"dtypes", "errors"}),
    frozenset({"sources", "treejson"}),
    frozenset({"remote"}),  # RemoteFile is a SourceFile; readers, commands, render use it
    frozenset({"tensors"}),
    frozenset({"checkpoint", "compare"}),
    frozenset({"unpickle"}),
    frozenset({"containers"}),
    frozenset({"quant"}),  # quantization schemes: names, dtypes, reference dequantization
    frozenset({"readers"}),
    frozenset({"rules", "writers"}),
    frozenset({"analysis"}),
    frozenset({"signing"}),  # OMS signatures and weights attestations over manifests
    frozenset({"commands"}),
    frozenset({"render"}),
    frozenset({"cli", "__init__", "__main__"}),
]

PACKAGE = Path(__file__).resolve().parent.parent / "ckptport"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``), for every module of ckptport."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The ckptport modules one import statement names (a submodule where it is one)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name.split(".")[0] == "ckptport")
        return
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != "ckptport":
        return
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in MODULES else base


def _imports() -> dict[str, set[str]]:
    """Module -> the ckptport modules it imports anywhere in its body."""
    graph = {}
    for module, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[module] = {target for node in ast.walk(tree)
                         if isinstance(node, (ast.Import, ast.ImportFrom))
                         for target in _targets(module, is_package, node)} - {module}
    return graph


IMPORTS = _imports()


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _level(room: str) -> int:
    return next(index for index, rooms in enumerate(LAYERS) if room in rooms)


def test_the_parse_sees_the_package():
    """A guard on the parse itself: known edges must be found, or the contract is vacuous."""
    assert "ckptport.unpickle.scan" in IMPORTS["ckptport.containers.sniff"]
    assert "ckptport.errors" in IMPORTS["ckptport.sources"]
    assert len(MODULES) > 50


def test_every_room_has_a_layer():
    rooms = {_room(module) for module in MODULES}
    listed = frozenset().union(*LAYERS)
    assert rooms - listed == set(), "add the new room to LAYERS"
    assert listed - rooms == set(), "LAYERS names rooms that no longer exist"
    assert sum(len(rooms) for rooms in LAYERS) == len(listed), "a room is in two layers"


def test_no_room_imports_a_room_above_it():
    upward = sorted(f"{module} imports {target}" for module, targets in IMPORTS.items()
                    for target in targets if _level(_room(target)) > _level(_room(module)))
    assert upward == []


def test_rooms_form_no_cycle():
    rooms: dict[str, set[str]] = {}
    for module, targets in IMPORTS.items():
        rooms.setdefault(_room(module), set()).update(
            _room(target) for target in targets if _room(target) != _room(module))
    _assert_acyclic(rooms)


def test_modules_form_no_cycle():
    """Inside a room too: no two modules import each other, at any depth (a function-level
    import is the same dependency). A package's ``__init__`` is its face, handing names on
    and holding registries its modules register into (``quant``), so it is left out."""
    faces = {module for module, (_, is_package) in MODULES.items() if is_package}
    _assert_acyclic({module: {t for t in targets if t in MODULES and t not in faces}
                     for module, targets in IMPORTS.items() if module not in faces})


def _assert_acyclic(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: tuple[str, ...]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            assert state.get(target) != 1, f"import cycle: {' -> '.join((*path, target))}"
            if target not in state:
                visit(target, (*path, target))
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, (node,))


def _command(module: str) -> str:
    """The command a module of ``commands/`` belongs to (a package is one command)."""
    return module.split(".")[2] if module.count(".") >= 2 else ""


def test_no_command_imports_another_command():
    """``commands/`` is one layer: each command is orchestration and its report type; what
    two commands share lives below (``analysis``, ``readers``, ``writers``)."""
    between = sorted(f"{module} imports {target}" for module, targets in IMPORTS.items()
                     if _room(module) == "commands"
                     for target in targets if _room(target) == "commands"
                     and _command(target) not in ("", _command(module)))
    assert between == []


MAX_LINES = 450  # a module past this holds two concerns: split it where they part


def test_no_module_is_too_long():
    long = sorted(f"{module} ({lines} lines)" for module, (path, _) in MODULES.items()
                  if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES)
    assert long == []
