"""A ``.pth`` is pickled without torch, and torch is imported beside the writing.

The stand-in globals (``writers.torchnames``) must give, byte for byte,
the pickle torch's own objects give; a tree whose strings spell the
stand-ins' marker is pickled with the real ones; writing imports no torch
on the writing thread; Ctrl-C while torch is still importing leaves
nothing behind.
"""

from __future__ import annotations

import collections
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from ckptport import normalize_file
from ckptport.dtypes import DTYPES
from ckptport.errors import VerificationError
from ckptport.writers import pth, torchnames
from ckptport.writers.staging import TEMP_SUFFIX


def _every_dtype() -> dict[str, object]:
    """A tree with one small tensor of each dtype torch makes plainly (quantized ones are
    pickled by torch itself), a tie, and the containers a checkpoint holds."""
    tree: dict[str, object] = {"epoch": 3, "names": ["a", "b"], "set": {3, 1},
                               "nested": collections.OrderedDict(lr=0.1, empty={})}
    for name, dtype in DTYPES.items():
        if not dtype.in_torch or dtype.kind == "q":
            continue
        try:
            tree[name] = torch.zeros(3, dtype=getattr(torch, name))
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            continue  # torch cannot make one (int1..int7 and the like)
    tree["tied"] = tree["float32"]
    return tree


def _real_pickle(tree: object) -> bytes:
    pickler = pth._Pickler("cpu", None, torchnames.real)
    pickler.dump(pth.canonical(tree))
    return pickler.buffer.getvalue()


@pytest.mark.filterwarnings("ignore::UserWarning")  # complex32 is "experimental"
def test_standin_pickle_is_the_real_pickle_byte_for_byte():
    tree = _every_dtype()
    pickled, pickler = pth._pickle(tree, "cpu", None)
    assert pickler.names is torchnames.standin
    assert {"_rebuild_tensor_v2", "_rebuild_tensor_v3", "UntypedStorage",
            "BFloat16Storage", "uint16"} <= pickler.used
    assert pickled == _real_pickle(tree)


def test_storage_classes_are_torchs():
    legacy = torch.storage._dtype_to_storage_type_map()
    new = torch.storage._new_dtypes()
    for name, dtype in DTYPES.items():
        real = getattr(torch, name, None) if dtype.in_torch else None
        if real is None or (real not in legacy and real not in new):
            continue  # torch pickles no tensor of it (int1..int7, FP6)
        assert torchnames.storage_class(dtype) == legacy.get(real), name


def test_a_string_spelling_the_marker_is_pickled_with_the_real_globals(tmp_path):
    spelled = torchnames.MARKER.decode() + "float32\n"
    tree = {"w": torch.arange(4.0), "note": spelled}
    pickled, pickler = pth._pickle(tree, "cpu", None)
    assert pickler.names is torchnames.real
    assert pickled == _real_pickle(tree)
    out = io.BytesIO()
    pth.write_pth(tree, out, "cpu", lambda n: None)
    out.seek(0)
    back = torch.load(out, weights_only=True)
    assert back["note"] == spelled and torch.equal(back["w"], tree["w"])


def test_writing_a_pth_imports_no_torch(fx):
    code = textwrap.dedent("""
        import io, sys
        from ckptport.readers import open_checkpoint
        from ckptport.rules import apply_rules
        from ckptport.writers.pth import write_pth
        tree = apply_rules(open_checkpoint(sys.argv[1]), lazy=True).checkpoint.tree
        out = io.BytesIO()
        write_pth(tree, out, "cpu", lambda n: None)
        assert "torch" not in sys.modules, "writing imported torch"
        sys.stdout.buffer.write(out.getvalue())
    """)
    done = subprocess.run([sys.executable, "-c", code, str(fx["ddp_cuda3"])],
                          capture_output=True, check=True)
    back = torch.load(io.BytesIO(done.stdout), weights_only=True)
    source = torch.load(fx["ddp_cuda3"], weights_only=False, map_location="cpu")  # ours
    want = {k.removeprefix("module."): v for k, v in source["state_dict"].items()}
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], want[k]) for k in want)


# torch "imports" until interrupted: the writing is done, the command waits for the import
SLOW_IMPORT_CHILD = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)
import ckptport.writers.torchnames as torchnames
def slow():
    Path(os.environ["MARK"]).touch()
    time.sleep(30)
torchnames._import_torch = slow
from ckptport.cli import main
sys.argv = ["ckptport", *sys.argv[1:]]
main()
"""


def test_ctrl_c_while_torch_imports_leaves_nothing(fx, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    mark = tmp_path / "MARK"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT_CHILD, "normalize",
                             str(fx["ddp_cuda3"]), str(out_dir / "model.pth")],
                            env={**os.environ, "MARK": str(mark)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the import never started"
        time.sleep(0.05)
    assert any(p.name.endswith(TEMP_SUFFIX) for p in out_dir.iterdir())
    time.sleep(0.5)  # the writing finishes; the command waits on the import
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "ckptport: error: interrupted; nothing was written"
    assert list(out_dir.iterdir()) == []


def test_a_failing_read_back_after_the_overlap_publishes_nothing(fx, tmp_path, monkeypatch):
    def refuse(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no such global")

    monkeypatch.setattr(torch, "load", refuse)
    dst = tmp_path / "model.pth"
    with pytest.raises(VerificationError, match="does not load with weights_only=True: no such"):
        normalize_file(fx["ddp_cuda3"], dst)
    assert list(tmp_path.iterdir()) == []
