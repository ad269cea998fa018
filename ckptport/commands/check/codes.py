"""The check codes: what each finds in a file (``CODES``), and which of them a run runs.

Each code has a stable name, a severity, and a one-line message naming the
file and the key it concerns; ``CODES`` documents what each finds, why it
matters and how to fix it (the README's table is made from it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...analysis.survey import InspectReport
from ...checkpoint import Checkpoint, Format
from ...errors import CkptportError, OptionError
from ...tensors import human_bytes
from ...unpickle import allowed_names
from ...unpickle.names import unresolved_package
from .file import CheckCode, CheckSettings, FileUnderCheck, Hit, Severity

if TYPE_CHECKING:
    from ...analysis.manifests import Manifest, ManifestComparison

__all__ = ["CODES", "ALWAYS", "chosen_codes", "dangerous_message", "spelled_as", "FINITE",
           "FORMATS", "REFERENCE", "MANIFEST", "ATTESTATION"]

# the options that give codes their inputs, spelled as ``CheckCode.needs`` and
# ``CheckSettings.given`` (and the messages) name them
FINITE = "--finite (or --finite-all)"
FORMATS = "--require-format"
REFERENCE = "--against REF"
MANIFEST = "--against-manifest FILE"
ATTESTATION = "--verify-signature FILE"


def spelled_as(name: str, raw: str | None) -> str | None:
    return f"{name} (named {raw} in the file)" if raw else None


def dangerous_message(name: str, spelled: str | None = None) -> str:
    return (f"dangerous global {spelled or name}: loading this file with full unpickling "
            "runs it (nothing was run)")


def _fate(name: str) -> str:
    """What ``normalize`` does with an object of this global, in words."""
    if name in allowed_names():
        return "normalize converts it to plain data"
    return "normalize keeps it as an inert record with --select all (nothing is run)"


def _device_bound(file: FileUnderCheck) -> Iterable[Hit]:
    for location, count in file.report.storage_locations.items():
        if location != "cpu":
            yield None, (f"{count} storages recorded on {location}; torch.load without "
                         "map_location fails without that device")


def _where(report: InspectReport) -> dict[str, str]:
    return {o.global_name: o.key for o in report.blocking_objects}


def _global_hit(file: FileUnderCheck, name: str, message: str) -> Hit:
    """A finding on a global: at its key, in the member file it was met in (a layout's)."""
    key = _where(file.report).get(name)
    member = file.checkpoint.source.origins.get(name)
    return (key, message) if member is None else (key, message, member)


def _beyond_weights_only(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for name in report.globals_beyond_weights_only:
        if name not in report.unproven_callables:
            spelled = spelled_as(name, report.spellings.get(name)) or name
            yield _global_hit(file, name, f"needs {spelled}, which torch.load("
                              f"weights_only=True) refuses; {_fate(name)}")


def _dangerous(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for name in report.dangerous_globals:
        yield _global_hit(file, name, dangerous_message(
            name, spelled_as(name, report.spellings.get(name))))


def _third_party_calls(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for name in report.unproven_callables:
        spelled = spelled_as(name, report.spellings.get(name)) or name
        package = unresolved_package(name)
        unseen = f"; ckptport never imports {package} to see what it does" if package else ""
        yield _global_hit(file, name, (
            f"calls {spelled}(…), which full unpickling would run; it cannot be proven "
            f"harmless{unseen} (nothing was run; normalize keeps the call as data, or refuses "
            "it when it is handed tensors)"))


def _expansion(file: FileUnderCheck) -> Iterable[Hit]:
    why = file.over_budget
    if why is not None:
        yield (file.checkpoint.source.largest[0][0] if file.checkpoint.source.largest
               else None), why


def _wrapper_prefixes(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for prefix, count in report.wrapper_prefixes.items():
        yield report.wrapper_examples.get(prefix), \
            f"{count} keys carry the wrapper prefix {prefix!r}"


def _storage_bloat(file: FileUnderCheck) -> Iterable[Hit]:
    for bloat in file.report.storage_bloat:
        yield bloat.key, (f"storage of {human_bytes(bloat.storage_bytes)} holds "
                          f"{human_bytes(bloat.used_bytes)} of tensor data")


def _non_finite(file: FileUnderCheck) -> Iterable[Hit]:
    from ...analysis.finite import non_finite
    from ...analysis.quantized import dequantized_non_finite

    assert file.settings.finite is not None  # chosen only with it (``chosen_codes``)
    if not file.values_readable:
        return ()
    stored = list(non_finite(file.checkpoint, file.settings.options, file.settings.finite,
                             file.settings.progress))
    # a quantized weight whose codes or scales are the finding is not dequantized again
    return [*stored, *dequantized_non_finite(file.checkpoint, {key for key, _ in stored})]


def _format(file: FileUnderCheck) -> Iterable[Hit]:
    formats, fmt = file.settings.formats, file.report.format.value
    if fmt not in formats:
        yield None, f"format {fmt}, required: {', '.join(formats)}"


def _against_reference(file: FileUnderCheck) -> Iterable[Hit]:
    if not file.values_readable:
        return ()
    return _against(file.checkpoint, file.settings)


def _against_manifest(file: FileUnderCheck) -> Iterable[Hit]:
    assert file.settings.manifest is not None  # chosen only with one (``chosen_codes``)
    return _against_listed(file, file.settings.manifest, "the manifest")


def _against_signature(file: FileUnderCheck) -> Iterable[Hit]:
    assert file.settings.attestation is not None  # chosen only with one (``chosen_codes``)
    return _against_listed(file, file.settings.attestation.manifest, "the signed attestation")


def _against_listed(file: FileUnderCheck, expected: Manifest, what: str) -> Iterable[Hit]:
    """The file's tensors against those ``expected`` lists (``what`` names the list)."""
    if not file.values_readable:
        return ()
    from ...analysis.manifests import against_manifest

    return _listed_hits(against_manifest(file.checkpoint, expected,
                                         progress=file.settings.progress), what)


def _listed_hits(found: ManifestComparison, what: str) -> list[Hit]:
    """A ``ManifestComparison`` as findings: each tensor missing, unexpected or changed."""
    hits = [(name, f"missing ({what} lists it)") for name in found.missing]
    hits += [(name, f"unexpected ({what} does not list it)") for name in found.unexpected]
    for want, have in found.changed:
        hits.append((want.name, f"{have.dtype}{list(have.shape)}, {what} says "
                                f"{want.dtype}{list(want.shape)}"
                     if (want.dtype, want.shape) != (have.dtype, have.shape) else
                     f"content changed (sha256 {have.sha256[:12]}…, {what} says "
                     f"{want.sha256[:12]}…)"))
    return sorted(hits)


def _code_archive(file: FileUnderCheck) -> Iterable[Hit]:
    if file.report.format is Format.TORCHSCRIPT:
        yield None, ("a TorchScript archive: loading it runs its code; use normalize --trust "
                     "if you vouch for it")


def _partial_layout(file: FileUnderCheck) -> Iterable[Hit]:
    from ...readers.layouts import PROBLEMS
    from ...readers.ranks import one_rank

    problems = file.checkpoint.source.metadata.get(PROBLEMS)
    for line in problems.splitlines() if problems else ():
        yield None, line
    shard = one_rank(file.checkpoint.tree)
    if shard is not None:
        key, layout = shard
        yield key, (f"holds rank {layout.rank}'s shard of a tensor sharded over {layout.world} "
                    "ranks: one rank file of a sharded state dict; read the folder of all "
                    "rank files as one checkpoint")


def _quantization(file: FileUnderCheck) -> Iterable[Hit]:
    from ...analysis.quantized import quantization_findings

    yield from quantization_findings(file.checkpoint, values=file.values_readable)


CODES = {rule.code: rule for rule in (
    CheckCode("CKP001", "device-bound", Severity.WARNING,
              "storages the file records on a device other than the CPU (cuda:3)",
              "torch.load without map_location fails on a machine without that device",
              "ckptport normalize SRC DST (maps to cpu; --anchor cpu)", _device_bound),
    CheckCode("CKP002", "globals-beyond-weights-only", Severity.WARNING,
              "globals plain torch.load(weights_only=True) refuses (argparse.Namespace, numpy, "
              "custom classes), each named with what normalize does with it",
              "since PyTorch 2.6 consumers must pass weights_only=False, which runs any code",
              "ckptport normalize SRC DST (turns objects into plain data)", _beyond_weights_only),
    CheckCode("CKP003", "dangerous-global", Severity.ERROR,
              "globals that run code, import or touch files (os.system, builtins.eval, "
              "subprocess.*, every standard-library global but its few data classes, what a "
              "name reaches: torch.os is os, …), each named; cannot be ignored",
              "loading the file with full unpickling runs that code",
              "do not load the file; rebuild it from a trusted source", _dangerous),
    CheckCode("CKP004", "wrapper-prefix", Severity.WARNING,
              "state-dict keys wrapped by DDP/DataParallel (module.), torch.compile "
              "(_orig_mod.), FSDP, activation checkpointing",
              "load_state_dict into the bare model fails with missing/unexpected keys",
              "ckptport normalize SRC DST (strips them)", _wrapper_prefixes),
    CheckCode("CKP005", "storage-bloat", Severity.WARNING,
              "storages larger than the bytes their tensors use (a saved slice of a big tensor)",
              "the file carries bytes nobody uses; downloads and loads cost more",
              "ckptport normalize SRC DST (compacts every storage)", _storage_bloat),
    CheckCode("CKP006", "non-finite", Severity.ERROR,
              "NaN or infinite values in floating-point tensors (with --finite)",
              "a diverged run exported as if it were good",
              "export from the last good step", _non_finite, FINITE),
    CheckCode("CKP007", "format", Severity.ERROR,
              "a container format other than --require-format",
              "consumers expect one format (safetensors loads without unpickling)",
              "ckptport normalize SRC DST.safetensors", _format, FORMATS),
    CheckCode("CKP008", "unreadable", Severity.ERROR,
              "a file that cannot be read: corrupt, truncated, ambiguous, hostile pickle",
              "nothing can load it, or loaders disagree on what it holds",
              "re-export it; the message says what is wrong"),
    CheckCode("CKP009", "disagrees-with-reference", Severity.ERROR,
              "tensors or values that differ from --against REF beyond --atol/--rtol",
              "the exported artifact is not the model that was validated",
              "export again from the reference, or compare with ckptport diff",
              _against_reference, REFERENCE),
    CheckCode("CKP010", "disagrees-with-manifest", Severity.ERROR,
              "tensors missing, unexpected, or with another dtype, shape or content than "
              "--against-manifest FILE records",
              "the artifact does not hold the weights that were released",
              "export again, or regenerate the manifest with ckptport manifest",
              _against_manifest, MANIFEST),
    CheckCode("CKP011", "code-archive", Severity.ERROR,
              "a TorchScript or torch.package archive: loading it runs code it carries",
              "torch.jit.load and PackageImporter execute the archive's code",
              "ckptport normalize --trust SRC DST if you vouch for it, then ship DST",
              _code_archive),
    CheckCode("CKP012", "third-party-call", Severity.WARNING,
              "third-party callables the file calls (an enum member, a config class, a "
              "function), which ckptport cannot prove harmless, each named",
              "full unpickling (weights_only=False) runs them; a package's own enums are "
              "usually benign, unlike CKP003's code-running names",
              "ckptport normalize SRC DST (keeps them as data); --ignore CKP012 to accept a "
              "package you trust", _third_party_calls),
    CheckCode("CKP013", "partial-layout", Severity.ERROR,
              "a sharded checkpoint that is not whole: a rank file missing, a rank claimed by "
              "two files (rank_1 and rank_01, bf16_ beside plain), rank files of another run "
              "or left over from one with more ranks, pieces (shards, DCP chunks) that leave a "
              "gap or overlap in a tensor, or one rank's file read alone",
              "consolidating it fails or silently mixes runs; a single rank's file holds a "
              "fraction of each tensor",
              "save again from every rank, remove stale or foreign rank files, or check the "
              "whole folder (DeepSpeed tag folder, folder of rank files or shard files)",
              _partial_layout),
    CheckCode("CKP014", "expansion", Severity.ERROR,
              "tensors that stand for more bytes than the budget allows relative to the "
              "file's size (stride-0 or overlapping views), naming the biggest",
              "normalize, manifest and --finite would write or read that much from a small "
              "file (a disk-filling or memory bomb)",
              "re-export the tensors compact; --max-expansion RATIO if the file is yours",
              _expansion),
    CheckCode("CKP015", "not-the-signed-weights", Severity.ERROR,
              "tensors missing, unexpected, or with another dtype, shape or content than the "
              "weights attestation --verify-signature FILE signs (its signature checked with "
              "--public-key or --certificate-chain; a bad one is exit 2)",
              "the artifact does not hold the weights that were signed, in any container",
              "ship the signed weights (ckptport normalize keeps them), or sign the new ones",
              _against_signature, ATTESTATION),
    CheckCode("CKP016", "quantization", Severity.ERROR,
              "a quantized checkpoint that cannot be dequantized correctly: a scale without "
              "its weight or an FP8 weight without its scale, scales that do not tile the "
              "weight or are NaN, infinite or zero, packed widths that do not divide, a "
              "config.json that contradicts the tensors, a tensor two schemes claim",
              "every consumer (vLLM, transformers, --dequantize) computes wrong weights or "
              "fails on it",
              "re-export the quantized model with its scales (docs/quantized.md)",
              _quantization),
)}



ALWAYS = "CKP003"  # runs whatever --codes/--ignore say: code-running names never pass


def chosen_codes(chosen: Iterable[str], skipped: Iterable[str], settings: CheckSettings
                 ) -> tuple[str, ...]:
    """The codes a run runs: those ``chosen`` (default: each whose input is given, and those
    that need none) less those ``skipped``; CKP003 always.

    Every input given must be read by a code that runs, and every code chosen must have
    its input: ``--codes CKP009`` without ``--against REF``, or ``--against REF`` with
    CKP009 left out, would pass without comparing anything.
    """
    picked = _code_list(chosen)
    left_out = _code_list(skipped)
    unknown = [c for c in (*picked, *left_out) if c not in CODES]
    if unknown:
        raise OptionError(f"unknown check code {', '.join(unknown)} (known: {', '.join(CODES)})")
    if ALWAYS in left_out:
        raise OptionError(f"{ALWAYS} cannot be ignored: a file whose full unpickling runs code "
                          "never passes check")
    lacking = [f"{c} runs only with {code.needs}" for c, code in CODES.items()
               if c in picked and code.needs is not None and code.needs not in settings.given]
    if lacking:
        raise OptionError(f"--codes: {', '.join(lacking)}: pass "
                          f"{'it' if len(lacking) == 1 else 'them'} too")
    runs = tuple(c for c, code in CODES.items() if c == ALWAYS or (
        (c in picked if picked else code.needs in (None, *settings.given))
        and c not in left_out))
    unread = [f"{code.needs} is {c}'s input, but "
              f"{'--ignore' if c in left_out else '--codes'} leaves {c} out"
              for c, code in CODES.items() if code.needs in settings.given and c not in runs]
    if unread:
        raise OptionError(f"{'; '.join(unread)}: it would change nothing")
    return runs


def _code_list(items: Iterable[str]) -> list[str]:
    """Codes as given: comma-separated or repeated, any case."""
    return [c.strip().upper() for item in items for c in str(item).split(",") if c.strip()]


def _against(checkpoint: Checkpoint, settings: CheckSettings) -> list[Hit]:
    """Differences from the reference, both sides normalized alike (``ckptport diff``)."""
    from ...analysis.diffing import compare_checkpoints

    reference = settings.reference
    assert reference is not None
    try:
        report = compare_checkpoints(reference, checkpoint,
                                     settings.tolerance,
                                     options_a=settings.options, options_b=settings.options,
                                     progress=settings.progress)
    except CkptportError as exc:  # e.g. no state dict to compare
        return [(None, f"cannot compare with the reference: {' '.join(exc.message.split())}")]
    rows: list[tuple[str | None, str]] = [
        *((k, "missing (in the reference only)") for k in report.only_in_a),
        *((k, "not in the reference") for k in report.only_in_b),
        *((m.key, f"shape {m.shape_b} vs {m.shape_a} in the reference")
          for m in report.shape_mismatches),
        *((d.key, f"{d.differing} values differ, max |a-b| {d.max_abs:.3g}")
          for d in report.value_mismatches),
        *((m.key, f"{m.b} vs {m.a} in the reference") for m in report.leaf_mismatches),
    ]
    if not report.tolerance.cast:
        rows += [(m.key, f"dtype {m.dtype_b} vs {m.dtype_a} in the reference")
                 for m in report.dtype_mismatches]
    name = reference.source.path.name
    return [(key, f"{what} ({name})") for key, what in rows]

