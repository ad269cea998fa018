"""torchao's flattened layout: one view of both of torchao's containers.

torchao's safetensors support (``torchao.prototype.safetensors.flatten_tensor_state_dict``,
what transformers calls to save a torchao model as safetensors) writes weight ``M.W``'s
inner tensors as ``M._W_qdata``, ``M._W_scale``, ``M._W_zero_point`` (and the optional
activation tensors), and its class and attributes as JSON in the header's metadata under
``M.W`` (``{"_type": "Int8Tensor", "_data": {"block_size": [1, 64], "dtype": ...},
"_tensor_data_names": [...]}``), with ``tensor_names`` listing the state dict. A ``.pth`` of
the subclasses is read (``ckptport.unpickle.torchao_values``) into the same: ``flatten`` gives
its inner tensors those names and its attributes that metadata, so each command sees one
layout, and writing without ``--dequantize`` keeps every inner tensor. The readers flatten,
the rules find each weight's metadata here, the scheme (``quant.torchao``) dequantizes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from ..dtypes import DType
from ..remote.urls import Where
from ..tree import (
    Key,
    KeyPath,
    ObjectRecord,
    StateDict,
    Tree,
    format_path,
    is_state_dict,
    is_tensor,
    rebuild_dict,
)
from ..unpickle.torchao_values import ENUM_NAMES, TENSOR_CLASSES, TUPLE_FIELDS, SubclassRecord
from . import QuantError

__all__ = ["flatten", "torchao_config", "gathered", "indexed_as", "part_name",
           "output_metadata", "described", "inner_part", "DATA_PARTS", "CONSUMED_PARTS"]

_MAX_METADATA = 1 << 20  # one weight's JSON is a few hundred bytes
# inner tensors: the ones dequantize() reads, then those consumed (activation quantization)
DATA_PARTS = ("qdata", "scale", "zero_point")
CONSUMED_PARTS = ("act_quant_scale", "act_quant_zero_point", "act_pre_scale")
_PARTS_LONGEST_FIRST = sorted((*DATA_PARTS, *CONSUMED_PARTS), key=len, reverse=True)


def inner_part(name: str) -> tuple[str, str] | None:
    """(``M.W``, part) for an inner tensor named ``M._W_part``; None for any other name
    (the longest part first: ``_W_act_quant_scale`` is not ``_W_act_quant``'s scale)."""
    module, _, leaf = name.rpartition(".")
    for part in _PARTS_LONGEST_FIRST:
        suffix = f"_{part}"
        if leaf.startswith("_") and leaf.endswith(suffix) and len(leaf) > len(suffix) + 1:
            base = leaf[1:-len(suffix)]
            return (f"{module}.{base}" if module else base), part
    return None


def part_name(weight: str, part: str) -> str:
    """Where torchao's safetensors support puts inner tensor ``part`` of ``weight``:
    ``M.W`` -> ``M._W_part``."""
    module, _, leaf = weight.rpartition(".")
    return f"{module}._{leaf}_{part}" if module else f"_{leaf}_{part}"


# -- a .pth's subclasses, flattened as torchao's safetensors support flattens them --------


def flatten(tree: Tree, path: Where, lenient: bool = False) -> tuple[Tree, dict[str, str]]:
    """``tree`` with each torchao subclass of a dict replaced by its inner tensors (named by
    ``part_name``), and the metadata torchao's safetensors support would write for them,
    keyed by each weight's path. A tree without one is returned as it is; an inner tensor's
    name the dict already holds is refused (``path``: the file), never overwritten, and so
    is a subclass without its ``qdata`` and ``scale`` tensors, which a ``lenient`` read (a
    report's) keeps as the record it is."""
    metadata: dict[str, str] = {}

    def walk(node: Tree, path_: KeyPath) -> Tree:
        if isinstance(node, Mapping):
            if not any(isinstance(v, SubclassRecord) for v in node.values()):
                changed = [(k, walk(v, (*path_, k))) for k, v in node.items()]
                if all(new is old for (_, new), old in zip(changed, node.values(), strict=True)):
                    return node
                return rebuild_dict(node, changed)
            items: list[tuple[Key, Tree]] = []
            for key, value in node.items():
                state = value.state if isinstance(value, SubclassRecord) and isinstance(
                    value.state, dict) else {}
                whole = all(is_tensor(state.get(p)) for p in ("qdata", "scale"))
                if isinstance(value, SubclassRecord) and not whole and not lenient:
                    raise QuantError(f"{format_path((*path_, key))}: a torchao "
                                     f"{value.short_name} without its qdata and scale "
                                     "tensors", path)
                if isinstance(value, SubclassRecord) and whole and isinstance(key, str):
                    metadata[format_path((*path_, key))] = json.dumps(_describe(value))
                    for part, inner in state.items():
                        name = part_name(key, part)
                        if is_tensor(inner) and name in node:
                            raise QuantError(f"{format_path((*path_, name))}: both a tensor and "
                                             f"the {part} of torchao weight {key}", path)
                        if is_tensor(inner):
                            items.append((name, inner))
                else:
                    items.append((key, walk(value, (*path_, key))))
            return rebuild_dict(node, items)
        if isinstance(node, list):
            return [walk(v, (*path_, i)) for i, v in enumerate(node)]
        return node

    flat = walk(tree, ())
    if metadata:
        metadata["tensor_names"] = json.dumps(list(metadata))
    return flat, metadata


def _describe(record: SubclassRecord) -> dict[str, Tree]:
    """A subclass as torchao's ``TensorSubclassAttributeJSONEncoder`` writes it."""
    state = record.state if isinstance(record.state, dict) else {}
    data = {k: _encoded(v) for k, v in state.items() if not is_tensor(v)}
    if record.dtype is not None:
        data["dtype"] = {"_type": "torch.dtype", "_data": record.dtype.name}
    return {"_type": record.short_name, "_data": data,
            "_tensor_data_names": [k for k, v in state.items() if is_tensor(v)]}


def _encoded(value: Tree) -> Tree:
    """An attribute as JSON: records by class and state, dtypes by name, tuples as lists."""
    if isinstance(value, ObjectRecord):
        short = value.name.rpartition(".")[2]
        if isinstance(value.state, dict):
            return {"_type": short, "_data": {k: _encoded(v) for k, v in value.state.items()}}
        names, fields = ENUM_NAMES.get(short, {}), TUPLE_FIELDS.get(short, ())
        if len(value.args) == 1 and value.args[0] in names:
            return {"_type": short, "_data": names[value.args[0]]}
        if len(value.args) == len(fields):
            return {"_type": short, "_data": dict(zip(fields, map(_encoded, value.args),
                                                      strict=True))}
        return {"_type": short, "_data": [_encoded(v) for v in value.args]
                if len(value.args) != 1 else _encoded(value.args[0])}
    if isinstance(value, (list, tuple)):
        return [_encoded(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encoded(v) for k, v in value.items()}
    if isinstance(value, DType):
        return {"_type": "torch.dtype", "_data": value.name}
    return value if value is None or type(value) in (str, int, float, bool) else str(value)


def torchao_config(config: Mapping[str, object] | None, metadata: Mapping[str, str],
                   prefix: str = "") -> Mapping[str, object] | None:
    """``config`` with the file's torchao metadata under ``torchao`` (each weight's class and
    attributes, parsed, by the name the file gives the weight) and ``prefix``, the path of
    the state dict being recognized, where the file has it and config.json names no other
    method; else ``config`` as it is."""
    if "tensor_names" not in metadata or (config and config.get("quant_method") not in (
            None, "torchao")):
        return config
    found: dict[str, dict[str, object]] = {}
    for name in _listed(metadata):
        text = metadata.get(name)
        if text is None or len(text) > _MAX_METADATA:
            continue
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(doc, dict) and doc.get("_type") in TENSOR_CLASSES:
            found[name] = doc
    if not found:
        return config
    return {**(config or {"quant_method": "torchao"}), "torchao": found, "torchao_prefix": prefix}


def described(weight: str, docs: Mapping[str, object], prefix: str) -> dict[str, object]:
    """The metadata of ``weight`` (a name in the state dict at ``prefix``): under its path,
    else the one entry a dotted suffix ties to it (the rules took ``model.`` or DDP's
    ``module.`` off the file's names). Several, or none though the file has some: refused,
    since the class and its dtype decide the values."""
    exact = docs.get(f"{prefix}.{weight}" if prefix else weight)
    if isinstance(exact, dict):
        return exact
    near = [name for name in docs if name.endswith(f".{weight}") or weight.endswith(f".{name}")]
    doc = docs[near[0]] if len(near) == 1 else None
    if not isinstance(doc, dict):
        which = f"several ({', '.join(near[:3])})" if near else "none"
        raise QuantError(f"{weight}: the file's torchao metadata describes {which} of the "
                         "weights by that name; its class and dtype decide the values")
    return doc


def gathered(parts: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The torchao metadata of a shard set's files as one file's: each weight's entry from
    the first file that has it, ``tensor_names`` the union (transformers writes the whole
    model's into every shard; a set ckptport did not write may split it)."""
    names: dict[str, None] = {}
    found: dict[str, str] = {}
    for metadata in parts:
        for name in _listed(metadata):
            if name in metadata:
                names[name] = None
                found.setdefault(name, metadata[name])
    if found:
        found["tensor_names"] = json.dumps(list(names))
    return found


def indexed_as(key: str, metadata: Mapping[str, str]) -> str:
    """The name a shard index lists ``key`` under: the weight, for an inner tensor of a
    subclass the shard's metadata describes (a ``.bin`` shard set's index names the
    subclasses ``torch.save`` pickled); else ``key`` itself."""
    inner = inner_part(key)
    return inner[0] if inner is not None and inner[0] in metadata else key


def output_metadata(carried: Mapping[str, str], source: Mapping[str, str],
                    tree: Tree) -> dict[str, str]:
    """``carried`` (the source metadata a safetensors output keeps) with torchao's own made
    for the output, as ``flatten_tensor_state_dict`` writes it: each torchao weight the
    output still holds (its ``_qdata``) under its name, found as recognition finds it, each
    other tensor as ``{"_type": "Tensor"}``, and ``tensor_names`` listing them; so a file
    written without ``--dequantize`` keeps its classes (torchao's loader reads it back) and a
    dequantized one carries no stale entry. Only where the output is one state dict."""
    config = torchao_config(None, source)
    docs = config.get("torchao") if config else None
    if not isinstance(docs, dict):
        return dict(carried)
    stale = {"tensor_names", *_listed(source)}
    kept = {k: v for k, v in carried.items() if k not in stale}
    if not is_state_dict(tree):
        return kept
    state: StateDict = tree
    made: dict[str, str] = {}
    weights = 0
    for key, leaf in state.items():
        inner = inner_part(key)
        if inner is None and is_tensor(leaf):
            made[key] = json.dumps({"_type": "Tensor"})
        elif inner is not None and inner[1] == "qdata":
            weights += 1
            try:
                made[inner[0]] = json.dumps(described(inner[0], docs, ""))
            except QuantError:
                continue  # no entry tells its class: recognition will refuse it, not guess
    if not weights:
        return kept
    return {**kept, **made, "tensor_names": json.dumps(list(made))}


def _listed(metadata: Mapping[str, str]) -> list[str]:
    """The names torchao's ``tensor_names`` lists (none when it is not a JSON list)."""
    try:
        names = json.loads(metadata.get("tensor_names", "[]"))
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
