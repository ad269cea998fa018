"""The weights attestation: a signed statement about weights, not files.

Its subject is the weights digest (``analysis.manifests``: the same in every
container ckptport reads, whatever the sharding, key order and ties); its
predicate, of type ``https://ckptport/weights/v1``, is the manifest itself —
every tensor's name, dtype, shape, size and sha256, and the options the
digest was computed with — plus, for the output of ``normalize --sign``, the
``derivation``: the source's weights digest and files, the options and
recipe applied, and the tool. A file converted to another container fails
the OMS signature over files (its bytes changed) and still matches this.

Reading is strict: only the known fields, integers exact (protobuf's JSON
writes ``12.0`` for the 12 it was given), the digest recomputed from the
listed tensors and equal to the subject's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.manifests import Manifest, manifest_from_json
from ..errors import InputError, SignatureError
from .bundles import SignedStatement

__all__ = ["WEIGHTS_PREDICATE", "Attestation", "weights_predicate", "read_attestation"]

WEIGHTS_PREDICATE = "https://ckptport/weights/v1"
_FIELDS = {"schema", "version", "ckptport", "options", "digest", "tensor_count",
           "total_bytes", "tensors", "quantization", "made_with", "derivation"}
_TENSOR_FIELDS = {"name", "dtype", "shape", "nbytes", "sha256", "tied", "alias_of", "tie_by"}
_DERIVATION_FIELDS = {"source", "options", "recipe_sha256", "tool"}
_SOURCE_FIELDS = {"name", "digest", "files"}
_EXACT = 1 << 53  # the integers a JSON double holds exactly


@dataclass(frozen=True)
class Attestation:
    """A verified weights attestation: the signed manifest, and how it was derived."""

    path: Path
    manifest: Manifest
    derivation: dict[str, Any] | None  # Any: parsed JSON, its fields checked on reading
    by: str


def weights_predicate(made: Manifest, derivation: Mapping[str, object] | None = None
                      ) -> dict[str, object]:
    import json

    predicate: dict[str, object] = json.loads(made.to_json())
    if derivation is not None:
        predicate["derivation"] = derivation
    return predicate


def read_attestation(signed: SignedStatement) -> Attestation:
    """The manifest a verified weights statement signs; ``SignatureError`` where the
    statement contradicts itself (a digest that is not its tensors', an unknown field)."""
    where = signed.path
    if signed.predicate_type != WEIGHTS_PREDICATE:
        raise SignatureError(f"not a weights attestation (predicate {signed.predicate_type})",
                             where)
    predicate = _exact(signed.statement["predicate"], where)
    _known(predicate, _FIELDS, "predicate", where)
    tensors = predicate.get("tensors")
    for index, entry in enumerate(tensors if isinstance(tensors, list) else ()):
        if isinstance(entry, dict):
            _known(entry, _TENSOR_FIELDS, f"predicate.tensors[{index}]", where)
    derivation = predicate.get("derivation")
    if derivation is not None:
        if not isinstance(derivation, dict) or not isinstance(derivation.get("source"), dict):
            raise SignatureError("weights attestation field \"derivation\" is not an object "
                                 "with a source", where)
        _known(derivation, _DERIVATION_FIELDS, "predicate.derivation", where)
        _known(derivation["source"], _SOURCE_FIELDS, "predicate.derivation.source", where)
    try:
        made = manifest_from_json({k: v for k, v in predicate.items() if k != "derivation"},
                                  where, "weights attestation")
    except InputError as exc:
        raise SignatureError(exc.message, where) from None
    subject = signed.statement["subject"][0]["digest"]["sha256"]
    if subject != made.digest:
        raise SignatureError(f"the statement's subject (sha256:{subject}) is not the digest of "
                             f"the tensors its predicate lists (sha256:{made.digest})", where)
    return Attestation(where, made, derivation, signed.by)


def _known(doc: Mapping[str, object], fields: set[str], where: str, path: Path) -> None:
    unknown = sorted(set(doc) - fields)
    if unknown:
        raise SignatureError(f"weights attestation has an unknown field {where}.{unknown[0]}",
                             path)


def _exact(value: Any, path: Path) -> Any:  # Any: parsed JSON, in and out
    """The predicate with its integral numbers as ints (protobuf writes every number as a
    double); a number that is not exactly an integer is kept as a float."""
    if isinstance(value, dict):
        return {k: _exact(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v, path) for v in value]
    if isinstance(value, float) and value.is_integer():
        if abs(value) >= _EXACT:
            raise SignatureError(f"weights attestation holds the number {value!r}, too large "
                                 "to be exact", path)
        return int(value)
    return value
