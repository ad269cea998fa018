"""A release a user can install, used the way a user would.

The sdist and the wheel build (``python -m build``); the wheel installs into a
fresh virtual environment (torch 2.13.0 first, then the wheel: not editable,
no repository on ``sys.path``) and the README's first walk runs against it;
``ckptport --version`` is the installed metadata's; the pre-commit hook runs
under real ``pre-commit`` against a local clone; docs/ci.md's GitHub Actions
step runs as written.

Each installs torch into a new environment, so these carry the ``release``
marker: ``make release`` (and ``.ci/run``) runs them, ``make test`` leaves
them out. ``TORCH_INDEX`` is the index torch comes from where pip's default
would hand out a CUDA build (the Makefile's variable).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import ckptport

pytestmark = pytest.mark.release

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
EXPECT = re.compile(r"#\s*exit (\d+)\b")


def _sh(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
        ok: tuple[int, ...] = (0,), timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode in ok, f"{args} exited {done.returncode}:\n" \
        f"{(done.stdout + done.stderr)[-4000:]}"
    return done


def _clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment a user's shell has: no PYTHONPATH, the venv's bin first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return env


def _torch_args() -> list[str]:
    index = os.environ.get("TORCH_INDEX")
    return [TORCH, *(["--index-url", index] if index else [])]


def _tracked_copy(dst: Path) -> Path:
    """The repository's tracked files as they are in the working tree: what a clone holds."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode:
        pytest.skip("not a git checkout: nothing to build a release from")
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the dev extra's build is not installed")
    source = _tracked_copy(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("dist")
    _sh(sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", out, source,
        env=_clean_env())
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, dist: Path) -> Path:
    """A fresh environment holding torch and the built wheel, nothing else of ours."""
    folder = tmp_path_factory.mktemp("venv")
    _sh(sys.executable, "-m", "venv", folder, env=_clean_env())
    python = folder / "bin" / "python"
    _sh(python, "-m", "pip", "install", "-q", *_torch_args(), env=_clean_env())
    (wheel,) = dist.glob("*.whl")
    _sh(python, "-m", "pip", "install", "-q", wheel, env=_clean_env())
    return folder


def test_the_sdist_and_the_wheel_hold_the_package(dist):
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    version = ckptport.__version__
    assert sdist.name == f"ckptport-{version}.tar.gz"
    assert wheel.name == f"ckptport-{version}-py3-none-any.whl"
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "ckptport/cli/__init__.py"} <= names
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        entry = whl.read(f"ckptport-{version}.dist-info/entry_points.txt").decode()
    assert "ckptport/cli/__init__.py" in names and not any(n.startswith(("tests/", "fixtures/"))
                                                     for n in names)
    assert "ckptport = ckptport.cli:main" in entry


def test_the_installed_wheel_is_what_runs(venv, tmp_path):
    where = _sh(venv / "bin" / "python", "-c", "import ckptport, json, importlib.metadata as m;"
                "d = m.distribution('ckptport');"
                "print(json.dumps([ckptport.__file__, d.read_text('direct_url.json')]))",
                cwd=tmp_path, env=_clean_env(venv)).stdout
    module, direct_url = json.loads(where)
    assert Path(module).is_relative_to(venv) and not Path(module).is_relative_to(ROOT)
    assert direct_url is None or not json.loads(direct_url).get("dir_info", {}).get("editable")
    version = _sh(venv / "bin" / "ckptport", "--version", env=_clean_env(venv)).stdout
    metadata = _sh(venv / "bin" / "python", "-c", "import importlib.metadata as m;"
                   "print(m.version('ckptport'))", env=_clean_env(venv)).stdout.strip()
    assert version == f"ckptport, version {metadata}\n" and metadata == ckptport.__version__


def _first_walk() -> tuple[str, str]:
    """The README's "A first walk": its bash block and its python block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## A first walk\n", 1)[1].split("\n## ", 1)[0]
    bash = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    python = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert bash and python, "the README's first walk lost its examples"
    return bash.group(1), python.group(1)


def test_the_readme_first_walk_runs_against_the_installed_wheel(venv, tmp_path):
    """In a folder holding what the walk names from a clone (the fixture and its model),
    with the venv's ``ckptport`` and ``python`` on PATH and no repository on sys.path."""
    (tmp_path / "fixtures").mkdir()
    for name in ("ddp_cuda3.pth", "models.py", "__init__.py"):
        shutil.copy2(ROOT / "fixtures" / name, tmp_path / "fixtures" / name)
    env = _clean_env(venv)
    bash, python = _first_walk()
    lines = [line for line in bash.splitlines() if line.strip() and not line.startswith("#")]
    assert lines
    for line in lines:
        expected = EXPECT.search(line)
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        want = int(expected.group(1)) if expected else 0
        assert done.returncode == want, f"{line}: exit {done.returncode}\n{done.stderr}"
    (tmp_path / "walk.py").write_text(python)
    _sh("python", "walk.py", cwd=tmp_path, env=env)
    assert (tmp_path / "model.safetensors").is_file()


def _committed_clone(dst: Path) -> str:
    """A local clone of this working tree (its uncommitted changes committed); its HEAD."""
    _tracked_copy(dst)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(dst)]
    _sh(*git, "init", "-q")
    _sh(*git, "add", "-A")
    _sh(*git, "commit", "-q", "-m", "release test")
    return _sh(*git, "rev-parse", "HEAD").stdout.strip()


def test_the_pre_commit_hook_gates_checkpoints_under_pre_commit(tmp_path):
    pytest.importorskip("pre_commit", reason="the dev extra's pre-commit is not installed")
    clone = tmp_path / "ckptport"
    rev = _committed_clone(clone)
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    shutil.copy2(ROOT / "fixtures" / "ddp_cuda3.pth", project / "models" / "ddp.pth")
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {clone}\n    rev: {rev}\n    hooks:\n      - id: ckptport-check\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(project)]
    _sh(*git, "init", "-q")
    _sh(*git, "add", "-A")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"{TORCH}\n")  # the hook's environment gets the same torch build
    env = {**_clean_env(), "PRE_COMMIT_HOME": str(tmp_path / "cache"),
           "PIP_CONSTRAINT": str(constraints)}
    if os.environ.get("TORCH_INDEX"):
        env["PIP_EXTRA_INDEX_URL"] = os.environ["TORCH_INDEX"]
    pre_commit = [sys.executable, "-m", "pre_commit", "run", "--all-files"]
    gated = _sh(*pre_commit, cwd=project, env=env, ok=(1,))
    assert "ckptport check" in gated.stdout and "CKP001" in gated.stdout, gated.stdout
    (project / "models" / "ddp.pth").unlink()
    ckptport.normalize_file(ROOT / "fixtures" / "ddp_cuda3.pth",
                            project / "models" / "model.safetensors")
    _sh(*git, "add", "-A")
    passed = _sh(*pre_commit, cwd=project, env=env)
    assert re.search(r"ckptport check\.+Passed", passed.stdout), passed.stdout


def _ci_step() -> list[str]:
    """The ``run:`` commands of docs/ci.md's GitHub Actions step, in order."""
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "docs" / "ci.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "jobs:" in b]
    steps = yaml.safe_load(block)["jobs"]["checkpoints"]["steps"]
    return [line for step in steps if "run" in step
            for line in step["run"].splitlines() if line.strip()]


def test_the_github_actions_step_in_the_docs_runs(venv, dist, tmp_path):
    """Its install lines are checked, not run (they fetch from the network: the venv holds
    what they install); every other line runs as written, in a repository's root."""
    commands = _ci_step()
    installs = [c for c in commands if c.startswith(("pip install", "python -m pip install"))]
    assert any(TORCH in c for c in installs) and any("ckptport" in c for c in installs)
    (tmp_path / "dist").mkdir()  # what an earlier job exported
    ckptport.normalize_file(ROOT / "fixtures" / "ddp_cuda3.pth",
                            tmp_path / "dist" / "model.safetensors")
    for command in commands:
        if command in installs:
            continue
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=_clean_env(venv),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}" \
            f"{done.stderr}"
