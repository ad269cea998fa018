"""Fixtures are generated once per test session by ``fixtures/make_fixtures.py``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result

from ckptport.cli import cli
from fixtures.make_fixtures import build

if TYPE_CHECKING:
    from fixtures.distributed import Launch


_WAITED_FOR = ("dist", "mcore")  # the fixtures that wait for the processes below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with a test that waits for the framework processes run last, each in its
    own order: by the time they start, the frameworks, trained meanwhile, have finished."""
    waiting = {item.path for item in items
               if any(name in item.fixturenames for name in _WAITED_FOR)}
    items.sort(key=lambda item: item.path in waiting)  # stable: the rest keep their order


def _behind(launch: Launch) -> Launch:
    """The framework processes on a lower priority than the tests: on 2 cores they train on
    the core the test process leaves over (the test process runs at full speed meanwhile,
    not at one share in eleven). Ranks restarted by ``wait()`` run at the normal one."""
    for proc, _ in launch.procs:
        with contextlib.suppress(ProcessLookupError):  # a rank already ended
            os.setpriority(os.PRIO_PROCESS, proc.pid, 10)
    return launch


@pytest.fixture(scope="session")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file the malicious fixtures' payload would create; it must never exist."""
    return tmp_path_factory.mktemp("sentinel") / "PWNED"


@pytest.fixture(scope="session", autouse=True)
def frameworks(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch | None]:
    """DeepSpeed, Lightning and FSDP start writing their checkpoints when the session starts.

    They take the longest of all fixtures (interpreter start-ups, rendezvous waits) and run
    in their own processes, so the tests before the first one that needs them (``dist``)
    run meanwhile. Sessions that collect no such test, or lack the frameworks, start none.
    """
    wanted = any("dist" in item.fixturenames for item in request.session.items)
    if not wanted or not all(find_spec(m) for m in ("deepspeed", "pytorch_lightning")):
        yield None
        return
    from fixtures.distributed import Launch

    launch = _behind(Launch(tmp_path_factory.mktemp("distributed")))
    yield launch
    launch.stop()


@pytest.fixture(scope="session")
def dist(frameworks: Launch | None) -> Path:
    """Real DeepSpeed, Lightning and FSDP checkpoints (world sizes 1 and 2), made once."""
    pytest.importorskip("deepspeed", reason="the test extra's deepspeed is not installed")
    pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed")
    assert frameworks is not None  # started by conftest for every session that uses dist
    return frameworks.wait()


@pytest.fixture(scope="session", autouse=True)
def megatron_saves(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch | None]:
    """megatron-core starts writing its saves when the session starts (its import alone
    takes seconds per rank), for sessions that collect a test using ``mcore``."""
    wanted = any("mcore" in item.fixturenames for item in request.session.items)
    if not wanted or find_spec("megatron") is None:
        yield None
        return
    from fixtures.megatron import Launch as MegatronLaunch

    launch = _behind(MegatronLaunch(tmp_path_factory.mktemp("megatron")))
    yield launch
    launch.stop()


@pytest.fixture(scope="session")
def mcore(megatron_saves: Launch | None) -> Path:
    """Real megatron-core dist_checkpointing saves (world sizes 1 and 2), made once."""
    if find_spec("megatron") is None:  # found, not imported: the readers are tested without it
        pytest.skip("the test extra's megatron-core is not installed")
    assert megatron_saves is not None
    return megatron_saves.wait()


@pytest.fixture(scope="session", autouse=True)
def gptq_oracle(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str] | None]:
    """GPTQModel, the GPTQ oracle (``tests/gptq_library.py``), imported in its own process
    when the session starts (it takes seconds), for sessions with a test using
    ``gptq_library``: that fixture hands it the folders on stdin."""
    wanted = any("gptq_library" in item.fixturenames for item in request.session.items)
    if not wanted or find_spec("gptqmodel") is None:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-m", "tests.gptq_library"], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    os.setpriority(os.PRIO_PROCESS, proc.pid, 10)  # on the core the tests leave over
    yield proc
    proc.kill()
    proc.communicate()


@pytest.fixture(scope="session")
def fx(tmp_path_factory: pytest.TempPathFactory, sentinel: Path) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("fixtures"), sentinel)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory, sentinel: Path) -> dict[str, Any]:
    """The hostile corpus (``fixtures/corpus.py``), built once per session."""
    from fixtures.corpus import build_corpus

    return build_corpus(tmp_path_factory.mktemp("corpus"), sentinel)


@pytest.fixture(scope="session")
def real_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_world")


@pytest.fixture(scope="session")
def real(real_root: Path) -> dict[str, Any]:
    """Checkpoints as people really have them (``fixtures/real_world.py``), with their truth."""
    from fixtures.real_world import build_real_world

    return build_real_world(real_root)


@pytest.fixture(scope="session")
def valid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Valid encodings every command must accept (``fixtures/valid_corpus.py``)."""
    from fixtures.valid_corpus import build_valid

    return build_valid(tmp_path_factory.mktemp("valid"))


@pytest.fixture
def run():
    """Invoke the CLI in-process; stdout and stderr kept apart."""

    def invoke(*args: object) -> Result:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return invoke
