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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptport
from ckptport.errors import CkptportError
from ckptport.readers import open_checkpoint
from ckptport.tensors import chunks
from ckptport.tree import ObjectRecord, format_path, iter_nodes, iter_tensors
from fixtures.valid_corpus import VALID_NAMES

Entry = tuple[str, tuple[int, ...], str]  # dtype, shape, sha256 of the canonical bytes

_TORCH_VIEW = r"""
import hashlib, json, sys, warnings
import torch
warnings.simplefilter("ignore")

def digest(t):
    t = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()

def flat(x, prefix, out):
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_quantized:
            out["<exotic>"] = ["", [], ""]
        else:
            dtype = str(x.dtype).removeprefix("torch.")
            out[prefix or "<root>"] = [dtype, list(x.shape), digest(x)]
        return True
    if isinstance(x, torch.nn.Module):  # a whole pickled model: the tensors it holds
        flat(x.state_dict(), prefix, out)
        return False
    if isinstance(x, dict):
        return all([flat(v, f"{prefix}.{k}" if prefix else str(k), out) for k, v in x.items()])
    if type(x) in (list, tuple):
        return all([flat(v, f"{prefix}.{i}" if prefix else str(i), out) for i, v in enumerate(x)])
    return x is None or type(x) in (int, float, str, bool, bytes, complex)

views = open(sys.argv[1], "w")
for line in sys.stdin:  # the files ckptport accepted, each as soon as it did
    path = line.rstrip("\n")
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
        record = {"path": path, "tensors": out, "plain": plain}
    except BaseException as exc:
        record = {"path": path, "error": type(exc).__name__}
    print(json.dumps(record), file=views, flush=True)
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


def _candidates(fx: dict[str, Path], corpus: dict[str, Any], valid: dict[str, Path]
                ) -> list[Path]:
    paths = list(fx.values()) + [case.path for case in corpus.values()] + list(valid.values())
    paths += sorted((Path(__file__).parent / "corpus").glob("*.pth"))
    return [p for p in dict.fromkeys(paths) if stat.S_ISREG(p.lstat().st_mode)]


def _torch_views(into: Path) -> subprocess.Popen[str]:
    """torch's view of each file written to its stdin, a JSON line each ``into``: started
    before the first file is accepted, it imports torch while ckptport reads."""
    return subprocess.Popen([sys.executable, "-c", _TORCH_VIEW, str(into)], text=True,
                            stdin=subprocess.PIPE)


def _read_views(torch_views: subprocess.Popen[str], into: Path) -> dict[str, dict[str, Any]]:
    torch_views.communicate(timeout=300)
    records = [json.loads(line) for line in into.read_text().splitlines()]
    return {record["path"]: record for record in records}


# What becomes of every candidate file, by name. A valid file newly refused, a
# hostile one newly accepted, a new file nobody placed, or a refusal for
# another cause fails test_every_file_has_its_expected_verdict.

# accepted, normalized, loaded by torch and compared tensor by tensor
COMPARED = (
    "ddp_cuda3.pth", "ddp_cuda3_legacy.pth", "plain.pth", "dp_in_ddp.pth", "compile_plain.pt",
    "compile_ddp.pt", "fsdp_style.bin", "slice.pth", "views.pth", "noncontig.pth", "tied.pth",
    "dtypes.pth", "ema_timm.pth", "ema_mmengine.pth", "nested.pth", "collide.pth",
    "protocol4.pth", "compat_builtin_long.pt", "compat_exceptions_value.pt",
    "compat_userdict_value.pt", "huge_size_value.pt", "pth_key_metadata.pth",
    "st_tree_remap.safetensors", "st_tree_deep.safetensors",
    "st_fake_source_sha256.safetensors", "st_leading_whitespace.safetensors",
    "st_f8_e8m0.safetensors", "st_metadata_prefixed_name.safetensors",
    "st_offsets_out_of_order.safetensors",
    *VALID_NAMES,  # every encoding torch has written (fixtures/valid_corpus.py)
)
# accepted and normalized; torch.load fails on it (its classes are not importable)
TORCH_CANNOT_LOAD = {"lightning.ckpt": "ModuleNotFoundError"}
# read as data, but check names it code-running (an fx GraphModule): never given to torch
CODE_RUNNING = ("torch_fx_reduce_graph_module.pt",)
# refused by the strict reader: a substring of the refusal -> the files refused for it
REFUSED: dict[str, tuple[str, ...]] = {
    "allowlist: posix.system,": (
        "malicious.pth", "malicious_legacy.pth", "posix_system.pt", "posix_system_legacy.pt",
        "call_posix_system.pt", "call_posix_system_legacy.pt", "raw_posix_system.pkl",
        "stack_global_binunicode8.pt", "build_monkeypatch_class.pt",
    ),
    "allowlist: os.system,": (
        "os_system.pt", "os_system_legacy.pt", "stack_global_memo.pt",
        "stack_global_memo_legacy.pt", "stack_global_proto0.pt", "stack_global_proto0_legacy.pt",
        "trailing_pickle_legacy.pt", "storage_missing_legacy.pt", "storage_short_legacy.pt",
        "call_os_system.pt", "call_os_system_legacy.pt", "stack_global_long_binget.pt",
        "stack_global_short_binunicode.pt", "stack_global_binstring.pt", "inst_os_system.pkl",
        "reduce_memo_callable.pt", "legacy_sys_info_payload.pt", "legacy_storage_keys_payload.pt",
    ),
    "allowlist: posixpath.os.system,": (
        "dotted_name.pt", "dotted_name_legacy.pt", "dotted_global_proto2.pt",
    ),
    "trailing data after the pickle's STOP": ("trailing_pickle.pt",),
    "(a memo bomb)": ("memo_bomb.pt", "memo_bomb_legacy.pt"),
    "claims 1099511627776 bytes but only": ("lying_frame.pt", "lying_frame_legacy.pt"),
    "crosses the end of its FRAME": ("frame_crossing.pt", "frame_crossing_legacy.pt"),
    "SETITEM on a argparse.Namespace, not a dict": (
        "setitem_on_non_dict.pt", "setitem_on_non_dict_legacy.pt",
    ),
    "storage record data/7 is missing from the archive": ("storage_missing.pt",),
    "holds 8 bytes but the pickle declares 4000": ("storage_short.pt", "zip_storage_short.pt"),
    "at offset 5 reaches past its storage of 2 elements": (
        "offset_past_storage.pt", "offset_past_storage_legacy.pt",
    ),
    "stride (4, 1) at offset 0 reaches past its storage": (
        "stride_past_storage.pt", "stride_past_storage_legacy.pt",
    ),
    "would need 4398046511104 bytes from a storage of 8": (
        "huge_declared_size.pt", "huge_declared_size_legacy.pt",
    ),
    "allowlist: nt.system,": (
        "call_nt_system.pt", "call_nt_system_legacy.pt", "raw_nt_system_proto0.pkl",
    ),
    "allowlist: builtins.eval,": (
        "call_builtins_eval.pt", "call_builtins_eval_legacy.pt", "legacy_magic_eval.pt",
    ),
    "allowlist: builtins.exec,": ("call_builtins_exec.pt", "call_builtins_exec_legacy.pt"),
    "allowlist: builtins.compile,": (
        "call_builtins_compile.pt", "call_builtins_compile_legacy.pt",
    ),
    "calls builtins.getattr on something other than a recorded class": (
        "call_builtins_getattr.pt", "call_builtins_getattr_legacy.pt",
    ),
    "allowlist: builtins.__import__,": (
        "call_builtins___import__.pt", "call_builtins___import___legacy.pt",
    ),
    "allowlist: subprocess.Popen,": (
        "call_subprocess_Popen.pt", "call_subprocess_Popen_legacy.pt", "obj_memo_popen.pt",
        "newobj_popen.pt", "newobj_ex_popen.pt",
    ),
    "allowlist: subprocess.check_output,": (
        "call_subprocess_check_output.pt", "call_subprocess_check_output_legacy.pt",
    ),
    "allowlist: pickle.loads,": ("call_pickle_loads.pt", "call_pickle_loads_legacy.pt"),
    "allowlist: torch.load,": ("call_torch_load.pt", "call_torch_load_legacy.pt"),
    "allowlist: functools.partial,": (
        "call_functools_partial.pt", "call_functools_partial_legacy.pt",
    ),
    "allowlist: timeit.timeit,": ("call_timeit_timeit.pt", "call_timeit_timeit_legacy.pt"),
    "allowlist: runpy.run_path,": ("call_runpy_run_path.pt", "call_runpy_run_path_legacy.pt"),
    "allowlist: importlib.import_module,": (
        "call_importlib_import_module.pt", "call_importlib_import_module_legacy.pt",
        "importlib_methodcaller_chain.pt",
    ),
    "allowlist: torch.storage._load_from_bytes,": (
        "call_torch_storage__load_from_bytes.pt", "call_torch_storage__load_from_bytes_legacy.pt",
        "torch_load_from_bytes_nested.pt",
    ),
    "allowlist: wave.Wave_write,": ("call_wave_Wave_write.pt", "call_wave_Wave_write_legacy.pt"),
    "allowlist: aifc.Aifc_write,": ("call_aifc_Aifc_write.pt", "call_aifc_Aifc_write_legacy.pt"),
    "allowlist: sunau.Au_write,": ("call_sunau_Au_write.pt", "call_sunau_Au_write_legacy.pt"),
    "allowlist: sqlite3.Connection,": (
        "call_sqlite3_Connection.pt", "call_sqlite3_Connection_legacy.pt",
    ),
    "allowlist: mailbox.Maildir,": ("call_mailbox_Maildir.pt", "call_mailbox_Maildir_legacy.pt"),
    "allowlist: mailbox.MH,": ("call_mailbox_MH.pt", "call_mailbox_MH_legacy.pt"),
    "corrupt or truncated zip archive": ("truncated.pth",),
    "not a PyTorch or safetensors checkpoint": ("random.pth",),
    "empty file (0 bytes)": ("empty.pth",),
    "allowlist: subprocess.Popen (named commands.Popen in the file),": (
        "compat_commands_popen.pt", "compat_copy_reg_reconstructor.pt",
    ),
    "allowlist: subprocess.getoutput (named commands.getoutput in the file),": (
        "compat_commands_getoutput.pt", "compat_stack_global_proto2.pt",
        "compat_inst_getoutput.pkl",
    ),
    "allowlist: builtins.eval (named __builtin__.eval in the file),": ("compat_builtin_eval.pt",),
    "allowlist: builtins.execfile (named __builtin__.execfile in the file),": (
        "compat_builtin_execfile.pt",
    ),
    "allowlist: posixpath.os, which can run code": ("compat_builtin_getattr.pt",),
    "allowlist: functools.reduce (named __builtin__.reduce in the file),": (
        "compat_builtin_reduce.pt",
    ),
    "allowlist: pickle.loads (named cPickle.loads in the file),": ("compat_cpickle_loads.pt",),
    "allowlist: urllib.request.urlretrieve (named urllib.urlretrieve in the file),": (
        "compat_urllib_urlretrieve.pt",
    ),
    "PROTO at byte 2, after the pickle started": (
        "compat_proto_switch_down.pt", "compat_proto_switch_up.pt",
    ),
    "allowlist: torch.utils.collect_env.run,": ("torch_collect_env_run.pt",),
    "allowlist: logging.FileHandler,": ("logging_file_handler.pt",),
    "allowlist: numpy.savetxt,": ("numpy_savetxt.pt",),
    "allowlist: numpy.load,": ("numpy_load.pt",),
    "allowlist: pydoc.pipepager,": ("pydoc_pipepager.pt",),
    "allowlist: subprocess.run,": ("subprocess_run.pt",),
    "allowlist: subprocess.getstatusoutput,": ("subprocess_getstatusoutput.pt",),
    "allowlist: _posixsubprocess.fork_exec,": ("posixsubprocess_fork_exec.pt",),
    "allowlist: pty.spawn,": ("pty_spawn.pt",),
    "allowlist: shutil.rmtree,": ("shutil_rmtree.pt",),
    "allowlist: socket.socket,": ("socket_socket.pt",),
    "allowlist: ctypes.CDLL,": ("ctypes_cdll.pt",),
    "allowlist: runpy._run_code,": ("runpy_run_code.pt",),
    "allowlist: code.InteractiveInterpreter.runcode,": ("code_interactive_runcode.pt",),
    "allowlist: pdb.run,": ("pdb_run.pt",),
    "allowlist: bdb.Bdb.run,": ("bdb_run.pt",),
    "allowlist: timeit.repeat,": ("timeit_repeat.pt",),
    "allowlist: cProfile.run,": ("cprofile_run.pt",),
    "allowlist: profile.run,": ("profile_run.pt",),
    "allowlist: trace.Trace.run,": ("trace_run.pt",),
    "allowlist: webbrowser.GenericBrowser.open,": ("webbrowser_generic_open.pt",),
    "allowlist: multiprocessing.util.spawnv_passfds,": ("multiprocessing_spawnv.pt",),
    "allowlist: sys.modules,": ("sys_modules_alias.pt",),
    "allowlist: marshal.loads,": ("marshal_function.pt",),
    "allowlist: types.CodeType,": ("types_code_type.pt",),
    "allowlist: _operator.attrgetter,": ("operator_attrgetter.pt",),
    "allowlist: operator.methodcaller,": ("operator_methodcaller.pt",),
    "allowlist: functools.reduce,": ("functools_reduce_exec.pt",),
    "allowlist: builtins.open,": ("builtins_open.pt",),
    "allowlist: builtins.breakpoint,": ("builtins_breakpoint.pt",),
    "allowlist: builtins.__dict__.get,": ("builtins_dict_get.pt",),
    "allowlist: torch.jit.load,": ("torch_jit_load.pt",),
    "allowlist: torch.hub._load_local,": ("torch_hub_load_local.pt",),
    "allowlist: torch.package.PackageImporter,": ("torch_package_importer.pt",),
    "allowlist: torch.utils.cpp_extension.load_inline,": ("torch_cpp_extension_load_inline.pt",),
    "allowlist: torch.serialization.load,": ("torch_serialization_load.pt",),
    "allowlist: torch._C._load_for_lite_interpreter,": ("torch_c_lite_interpreter.pt",),
    "allowlist: torch.fx.graph_module._forward_from_src,": ("torch_fx_forward_from_src.pt",),
    "allowlist: _pickle.loads,": ("pickle_loads_nested.pt",),
    "allowlist: asyncio.subprocess.create_subprocess_shell,": ("asyncio_subprocess_shell.pt",),
    "allowlist: os.popen,": ("os_popen.pt",),
    "allowlist: os.execv,": ("os_execv.pt",),
    "allowlist: os.spawnv,": ("os_spawnv.pt",),
    "allowlist: torch.os.system,": ("dotted_torch_os_system.pt",),
    "allowlist: torch.utils.data.datapipes.utils.decoder.basichandlers,": (
        "datapipes_basichandlers.pt",
    ),
    "allowlist: uuid._get_command_stdout,": ("uuid_command_stdout.pt",),
    "allowlist: pkgutil.resolve_name,": ("pkgutil_resolve_name.pt",),
    "allowlist: _io.FileIO,": ("io_file_io.pt",),
    "STACK_GLOBAL requires str": ("stack_global_binbytes.pt", "stack_global_int_module.pt"),
    "Memo value not found at index 3": ("memo_missing_key.pt",),
    "pickle opcode EXT1 at byte 2 is not supported": ("ext1_code.pt",),
    "pickle opcode EXT2 at byte 2 is not supported": ("ext2_code.pt",),
    "pickle opcode EXT4 at byte 2 is not supported": ("ext4_code.pt",),
    "a persistent id other than a storage ('str')": ("persid_text.pt",),
    "the file is a bare pickle of a dict": ("raw_trailing_pickle.pkl",),
    "pickle opcode NEXT_BUFFER": ("proto5_next_buffer.pt",),
    "pickle opcode READONLY_BUFFER": ("proto5_readonly_buffer.pt",),
    "the pickle nests deeper than 300 levels": ("nested_lists_100k.pt", "nested_dict_10k.pt"),
    "names memo slot 2147483648": ("long_binput_2_31.pt",),
    "declares 1099511627776 bytes, past the end of the data": (
        "binbytes8_lying_length.pt", "bytearray8_lying_length.pt", "binunicode8_lying_length.pkl",
    ),
    "creates an object ckptport does not create that way": ("ordereddict_via_newobj.pt",),
    "an integer of 332193 bits at step": ("long4_huge_int.pt",),
    "pickled state sets 'data'": ("parameter_state_swaps_data.pt", "from_type_v2_swaps_data.pt"),
    "BUILD on a TensorInfo": ("build_on_tensor.pt",),
    "a meta tensor (no data) at w": ("huge_meta_tensor.pt",),
    "a bare storage (not a tensor) at s": ("untyped_storage_value.pt",),
    "calls torch.UntypedStorage, which ckptport takes only as a type": (
        "untyped_storage_alloc.pt",
    ),
    "calls torch.FloatTensor, which ckptport takes only as a type": ("float_tensor_alloc.pt",),
    "bytearray takes bytes, not int": ("compat_bytearray_alloc.pt",),
    "numpy array shape does not match its data": ("numpy_reconstruct_huge.pt",),
    "allowlist: typing.OrderedDict,": ("typing_ordereddict.pt",),
    "allowlist: collections.OrderedDict.fromkeys,": ("dotted_ordereddict_fromkeys.pt",),
    "is not a plain dtype as numpy pickles one": ("numpy_object_array.pt",),
    "a dict key at <root> is a TensorInfo": ("tensor_dict_key.pt",),
    "a sparse tensor at w": ("sparse_coo.pt", "sparse_csr.pt"),
    "a nested tensor at w": ("nested_tensor.pt",),
    "a quantized tensor at w": ("quantized_tensor.pt",),
    "member 'archive/data.pkl' appears twice": ("zip_case_shadow.pt", "zip_duplicate_name.pt"),
    "member name b'archive/data.pkl\\x00x' is not printable ASCII": ("zip_nul_in_name.pt",),
    "expected 0 (bytes hidden before it": ("zip_two_central_directories.pt",),
    "holds a zip directory at its end but does not start as a zip archive": (
        "zip_junk_prefix.pt", "legacy_zip_appended.pt",
    ),
    "its local header disagrees with the central directory": ("zip_cd_lh_name_mismatch.pt",),
    "its local header's sizes or CRC disagree": ("zip_cd_lh_size_mismatch.pt",),
    "member 'archive/data.pkl' uses compression method 0": ("zip_cd_lh_method_mismatch.pt",),
    "storage record data/0 is compressed": ("zip_deflated_storage.pt",),
    "a tar archive: torch.load reads tar archives before pickles": (
        "tar_legacy_polyglot.pt", "safetensors_tar_polyglot.safetensors",
    ),
    "is both a safetensors file and a pickle": ("safetensors_pickle_polyglot.safetensors",),
    "tensor 'a' has unsupported dtype ['F32']": ("st_dtype_list.safetensors",),
    "tensor 'a' has an invalid shape [True]": ("st_shape_bool.safetensors",),
    "tensor 'a' has an invalid shape [-1]": ("st_shape_negative.safetensors",),
    "tensor 'a' has an invalid shape [1.0]": ("st_shape_float.safetensors",),
    "tensor 'b' starts at byte 4, expected 8": ("st_offsets_overlap.safetensors",),
    "tensor 'b' starts at byte 8, expected 4": ("st_offsets_gap.safetensors",),
    "the data has 6 trailing bytes beyond the last tensor": ("st_trailing_bytes.safetensors",),
    "the JSON header names 'a' twice": ("st_duplicate_key.safetensors",),
    "the JSON header holds NaN": ("st_nan_literal.safetensors",),
    "the JSON header holds an invalid unicode escape": ("st_lone_surrogate.safetensors",),
    "declares 8165634168991609713 bytes, past the end of the data": (
        "legacy-lying-string-length.pth",
    ),
    "a malformed storage persistent id": ("zip-location-not-a-string.pth",),
    "is not printable ASCII": ("zip-name-not-utf8.pth",),
    "member 'ddp_cuda3/data/7' is encrypted or uses unsupported flags": (
        "zip-unsupported-encryption.pth",
    ),
    "member 'ddp_cuda3/data/14' uses compression method 1": ("zip-unsupported-method.pth",),
}
# issue 18 accepts a legacy persistent id ('module', ...) as data: the payload after it
# is then what refuses the file. Either cause passes until that lands; refused it stays.
EITHER_CAUSE = dict.fromkeys(
    ("persistent_id_not_storage.pt", "persistent_id_not_storage_legacy.pt"),
    ("a persistent id other than a storage", "allowlist: os.system,"))


@dataclass(frozen=True)
class Accepted:
    """A file the strict reader accepts: ckptport's view and its normalized output."""

    path: Path
    ours: dict[str, Entry]
    plain: bool
    out: Path
    arrays: set[str]


@dataclass(frozen=True)
class Verdicts:
    accepted: dict[str, Accepted]
    code_running: tuple[str, ...]
    refused: dict[str, str]  # name -> the refusal, the file's path left out
    normalize_refused: dict[str, str]
    torch_views: dict[str, dict[str, Any]]  # str(path) -> what torch loads of an accepted file


@pytest.fixture(scope="module")
def verdicts(fx, corpus, valid, tmp_path_factory) -> Verdicts:
    out_dir = tmp_path_factory.mktemp("agreement")
    with _torch_views(out_dir / "torch_views.jsonl") as torch_views:  # ended on a failure too
        accepted, code_running, refused, normalize_refused = {}, [], {}, {}
        for index, path in enumerate(_candidates(fx, corpus, valid)):
            assert path.name not in {*accepted, *code_running, *refused, *normalize_refused}, \
                f"two candidate files are named {path.name}: the tables go by name"
            try:
                strict = open_checkpoint(path)
            except CkptportError as exc:
                refused[path.name] = str(exc).replace(str(path), "<path>")
                continue
            described = open_checkpoint(path, lenient=True)
            ours = _ours(strict.tree)
            assert _ours(described.tree) == ours, f"{path.name}: inspect and read disagree"
            out = out_dir / f"{index}.pth"
            options = ckptport.NormalizeOptions(select="all", keep_prefixes=True)
            try:
                ckptport.normalize_file(path, out, options)
            except CkptportError as exc:
                normalize_refused[path.name] = str(exc)
                continue
            if strict.source.refused_globals or strict.source.unproven:
                code_running.append(path.name)
                continue
            accepted[path.name] = Accepted(path, ours, not _has_records(strict.tree), out,
                                           _numpy_arrays(strict.tree))
            assert torch_views.stdin is not None
            torch_views.stdin.write(f"{path}\n")
            torch_views.stdin.flush()
        views = _read_views(torch_views, out_dir / "torch_views.jsonl")
    return Verdicts(accepted, tuple(code_running), refused, normalize_refused, views)


def _expected_verdicts() -> dict[str, str]:
    expected = dict.fromkeys(COMPARED, "compared")
    expected.update(dict.fromkeys(TORCH_CANNOT_LOAD, "accepted, torch cannot load it"))
    expected.update(dict.fromkeys(CODE_RUNNING, "code-running"))
    for names in (*REFUSED.values(), EITHER_CAUSE):
        expected.update(dict.fromkeys(names, "refused"))
    return expected


def test_the_tables_name_each_file_once():
    listed = [*COMPARED, *TORCH_CANNOT_LOAD, *CODE_RUNNING, *EITHER_CAUSE,
              *(name for names in REFUSED.values() for name in names)]
    assert len(listed) == len(set(listed)) == len(_expected_verdicts())


def test_every_file_has_its_expected_verdict(verdicts):
    found = dict.fromkeys(verdicts.refused, "refused")
    found.update(dict.fromkeys(verdicts.code_running, "code-running"))
    found.update({name: f"normalize refused: {message}"
                  for name, message in verdicts.normalize_refused.items()})
    found.update({name: "compared" if name not in TORCH_CANNOT_LOAD
                  else "accepted, torch cannot load it" for name in verdicts.accepted})
    expected = _expected_verdicts()
    assert {n: (expected.get(n), found.get(n)) for n in {*expected, *found}
            if expected.get(n) != found.get(n)} == {}


def test_refusals_name_their_cause(verdicts):
    causes = {name: (cause,) for cause, names in REFUSED.items() for name in names}
    causes.update(EITHER_CAUSE)
    wrong = {name: message for name, message in verdicts.refused.items()
             if not any(cause in message for cause in causes.get(name, ()))}
    assert wrong == {}


def test_normalize_writes_what_inspect_sees(verdicts):
    for name, file in verdicts.accepted.items():
        written = torch.load(file.out, weights_only=True)
        theirs = {k: v for k, v in _ours(written).items() if k not in file.arrays}
        assert _same(file.ours, theirs, file.plain), name


def test_torch_loads_what_ckptport_reads(verdicts, sentinel):
    compared = []
    for name, file in verdicts.accepted.items():
        view = verdicts.torch_views.get(str(file.path))
        assert view is not None, f"{name}: the torch subprocess died on it"
        if name in TORCH_CANNOT_LOAD:
            assert view.get("error") == TORCH_CANNOT_LOAD[name], (name, view)
            continue
        assert "error" not in view, (name, view["error"])
        assert "<exotic>" not in view["tensors"], f"{name}: torch loads a non-strided tensor"
        theirs = {k: (d, tuple(s), h) for k, (d, s, h) in view["tensors"].items()}
        assert _same(file.ours, theirs, file.plain and view["plain"]), name
        compared.append(name)
    assert sorted(compared) == sorted(COMPARED)
    assert not sentinel.exists(), "torch.load ran code from a file ckptport accepted"
