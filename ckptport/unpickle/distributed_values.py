"""Distributed tensors as data: DTensor and ShardedTensor, read from their pickled state.

``torch.save`` of an FSDP or tensor-parallel state dict pickles DTensors
and ShardedTensors as wrapper subclasses whose state names the device mesh,
the placements and the shard metadata. ``torch.load(weights_only=True)``
reads them as data, so must ckptport: the state's parts are inert records
of plain data (``data_records``), never the real classes, and a
distributed tensor becomes either its local tensor (when the file holds it
whole: world size 1, ``Replicate``) or a ``ShardRecord``: the local shard
described, where it lies in the global tensor, the placements and the
global shape, which the rank-file readers assemble. Nothing here imports
torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..dtypes import DType
from ..sealed import sealed
from ..tensors import TensorInfo
from ..tree import ObjectRecord, RecordKind, Tree
from .data_records import DataRecord, data_class, record_of, records_table, slots_state
from .torch_values import _from_type
from .values import Allowed, Refusal, Size, Unsupported

__all__ = ["distributed_table", "ShardRecord", "ShardLayout", "Piece", "DTENSOR",
           "SHARDED_TENSOR"]

DTENSOR = "torch.distributed.tensor.DTensor"
SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor.api.ShardedTensor"
_WRAPPER = "torch._utils._rebuild_wrapper_subclass"
_ENUMERABLE = "torch.distributed._shard.sharding_spec.api.EnumerableShardingSpec"
_GROUP_STATE = SHARDED_TENSOR + ".ProcessGroupState"
_GROUP_FIELDS = ("local_rank", "global_rank", "local_world_size", "global_world_size")
_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"

_DTENSOR_PARTS = (
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types._StridedShard",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout",
)
_SHARDED_TENSOR_PARTS = (
    "torch.distributed._shard.sharded_tensor.shard.Shard",
    "torch.distributed._shard.metadata.ShardMetadata",
    "torch.distributed._shard.sharded_tensor.metadata.ShardedTensorMetadata",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec",
    _ENUMERABLE,
    "torch.distributed.remote_device._remote_device",
)
_MAX_DIMS = 64


@sealed
@dataclass(frozen=True, slots=True)
class Piece:
    """A local shard: where it lies in the global tensor (``offsets``) and its bytes."""

    offsets: tuple[int, ...]
    tensor: TensorInfo

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.tensor.shape


@sealed
@dataclass(frozen=True, slots=True)
class ShardLayout:
    """What one rank's file says about a distributed tensor.

    ``world`` is the number of ranks it is spread over, ``rank`` the saving
    rank's place among them (mesh coordinates flattened, or the shard
    placement's rank); ``expected`` the boxes (offsets, sizes) every shard
    covers when the file records them all (ShardedTensor's metadata).
    """

    kind: str
    shape: tuple[int, ...]
    dtype: DType
    world: int
    rank: int
    pieces: tuple[Piece, ...]
    placements: tuple[str, ...]
    expected: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()


@dataclass(eq=False)
class ShardRecord(ObjectRecord):
    """A distributed tensor one rank holds part of, as reports show it and readers assemble it."""

    layout: ShardLayout | None = field(default=None, repr=False)


@sealed
@dataclass(frozen=True, slots=True)
class _Shell:
    """What ``_rebuild_wrapper_subclass`` declares: the global tensor's class, dtype, shape."""

    kind: str
    dtype: DType
    shape: tuple[int, ...]
    requires_grad: bool


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS or not all(
            type(v) is int and v >= 0 for v in value):
        raise Refusal(f"{what} must be a short tuple of non-negative ints")
    return tuple(value)


def _wrapper(cls: object, dtype: object, size: object, stride: object, offset: object,
             layout: object, device: object, requires_grad: object, *rest: object
             ) -> _Shell | Unsupported:
    if not (isinstance(cls, type) and issubclass(cls, DataRecord)
            and cls.record_name in (DTENSOR, SHARDED_TENSOR)):
        return Unsupported("a tensor subclass (only DTensor and ShardedTensor are read)")
    if not isinstance(dtype, DType) or type(requires_grad) is not bool:
        raise Refusal("_rebuild_wrapper_subclass takes a dtype and flags")
    return _Shell(cls.record_name, dtype, _ints(size, "a distributed tensor's size"),
                  requires_grad)


def _from_type_distributed(func: object, new_type: object, args: object, state: object
                           ) -> Tree:
    """``_rebuild_from_type_v2``: DTensor and ShardedTensor here, plain tensors in torch_values."""
    if not (isinstance(func, Allowed) and func.name == _WRAPPER):
        return _from_type(func, new_type, args, state)
    if not isinstance(args, tuple):
        raise Refusal("a wrapper subclass rebuilt from something other than a tuple")
    shell = func(*args)
    if not isinstance(shell, _Shell):  # Unsupported: a wrapper subclass of another kind
        return shell
    if new_type is not _TENSOR_CLASSES[shell.kind]:
        raise Refusal("a distributed tensor rebuilt as another class")
    layout = _dtensor(shell, state) if shell.kind == DTENSOR else _sharded_tensor(shell, state)
    return _value(shell, layout)


def _value(shell: _Shell, layout: ShardLayout) -> TensorInfo | ShardRecord:
    """The local tensor when it is the whole tensor, else the shard's record."""
    for piece in layout.pieces:
        if piece.tensor.dtype != shell.dtype:
            raise Refusal(f"a {shell.kind} of {shell.dtype.name} holds a local shard of "
                          f"{piece.tensor.dtype.name}")
        if len(piece.offsets) != len(shell.shape) or any(
                o + n > g for o, n, g in zip(piece.offsets, piece.sizes, shell.shape,
                                             strict=True)):
            raise Refusal(f"a {shell.kind} shard at {piece.offsets} of size {piece.sizes} "
                          f"reaches past the global shape {shell.shape}")
    whole = [p for p in layout.pieces if p.sizes == shell.shape]
    if whole:
        tensor = whole[0].tensor
        return TensorInfo(tensor.dtype, tensor.shape, tensor.strides, tensor.offset,
                          tensor.storage, shell.requires_grad)
    state = {"global_shape": Size(shell.shape), "placements": list(layout.placements),
             "world_size": layout.world, "rank": layout.rank,
             "local_shards": [{"offsets": list(p.offsets), "tensor": p.tensor}
                              for p in layout.pieces]}
    return ShardRecord(shell.kind, RecordKind.INSTANCE, (), {}, state, {}, [], layout)


def _mesh(spec: DataRecord) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The mesh's shape and the saving rank's coordinates on it."""
    mesh = record_of(spec.field("mesh"), "torch.distributed.device_mesh.DeviceMesh",
                     "a DTensor's mesh")
    coordinates = mesh.field("_coordinate_on_dim")
    layout, ranks = mesh.field("_layout"), mesh.field("mesh")
    axes = layout.field("axes") if isinstance(layout, DataRecord) else None
    shape: list[int]
    if isinstance(axes, (tuple, list)):
        shape = []
        for axis in axes:
            sizes = axis.field("shape") if isinstance(axis, DataRecord) else None
            shape.append(math.prod(_ints(sizes, "a mesh axis's shape")))
    elif isinstance(ranks, TensorInfo):
        shape = list(ranks.shape)
    else:
        raise Refusal("a DTensor's mesh records no shape")
    coords = _ints(coordinates, "a DTensor's mesh coordinates")
    if len(coords) != len(shape) or any(c >= n for c, n in zip(coords, shape, strict=True)):
        raise Refusal(f"mesh coordinates {coords} lie outside the mesh {tuple(shape)}")
    return tuple(shape), coords


def _placement(value: object) -> tuple[str, int | None]:
    """A placement's name for reports and the dimension it shards (None: replicated)."""
    if isinstance(value, DataRecord):
        short = value.record_name.rpartition(".")[2]
        if short == "Replicate":
            return "Replicate()", None
        if short == "Shard":
            dim = value.field("dim")
            if type(dim) is not int or dim < 0:
                raise Refusal("a Shard placement without a dimension")
            return f"Shard({dim})", dim
        if short == "Partial":
            raise Refusal("a DTensor with a Partial placement holds partial sums, not "
                          "shards; reduce it (full_tensor()) before saving")
    raise Refusal("a DTensor placement ckptport does not assemble (_StridedShard or unknown)")


def _dtensor(shell: _Shell, state: Tree) -> ShardLayout:
    """A DTensor's local shard and where it lies, as torch's
    ``compute_local_shape_and_global_offset`` places it: each sharded mesh dimension
    splits the tensor dimension in chunks of ``ceil(n / k)``."""
    state = slots_state(state)
    if not isinstance(state, dict):
        raise Refusal("a DTensor's state must be a dict")
    local = state.get("_local_tensor")
    if not isinstance(local, TensorInfo):
        raise Refusal("a DTensor without a local tensor")
    spec = record_of(state.get("_spec"), "torch.distributed.tensor._dtensor_spec.DTensorSpec",
                     "a DTensor's spec")
    mesh_shape, coords = _mesh(spec)
    placements = spec.field("placements")
    if not isinstance(placements, (tuple, list)) or len(placements) != len(mesh_shape):
        raise Refusal("a DTensor's placements do not match its mesh")
    named = [_placement(p) for p in placements]
    sizes, offsets = list(shell.shape), [0] * len(shell.shape)
    for (_, dim), parts, coord in zip(named, mesh_shape, coords, strict=True):
        if dim is None:
            continue
        if dim >= len(sizes):
            raise Refusal(f"a Shard({dim}) placement on a {len(sizes)}-d tensor")
        chunk = -(-sizes[dim] // parts) if sizes[dim] else 0
        start = min(coord * chunk, sizes[dim])
        offsets[dim] += start
        sizes[dim] = max(0, min(sizes[dim], start + chunk) - start)
    if tuple(sizes) != local.shape:
        raise Refusal(f"a DTensor's local tensor has shape {local.shape}; its placements "
                      f"give {tuple(sizes)}")
    rank = 0
    for coord, parts in zip(coords, mesh_shape, strict=True):
        rank = rank * parts + coord
    return ShardLayout(DTENSOR, shell.shape, shell.dtype, math.prod(mesh_shape), rank,
                       (Piece(tuple(offsets), local),), tuple(n for n, _ in named))


def _box(metadata: Tree) -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
    meta = record_of(metadata, "torch.distributed._shard.metadata.ShardMetadata",
                     "a shard's metadata")
    offsets = _ints(meta.field("shard_offsets"), "shard offsets")
    sizes = _ints(meta.field("shard_sizes"), "shard sizes")
    if len(offsets) != len(sizes):
        raise Refusal("shard offsets and sizes differ in length")
    placement = meta.field("placement")
    rank = placement.field("_rank") if isinstance(placement, DataRecord) else None
    return offsets, sizes, rank if type(rank) is int else None


def _sharded_tensor(shell: _Shell, state: Tree) -> ShardLayout:
    """A ShardedTensor's local shards and the boxes its metadata says every rank holds."""
    if not (isinstance(state, tuple) and len(state) >= 2 and isinstance(state[0], list)):
        raise Refusal("a ShardedTensor's state must be (local shards, metadata, ...)")
    metadata = record_of(state[1], "torch.distributed._shard.sharded_tensor.metadata."
                         "ShardedTensorMetadata", "a ShardedTensor's metadata")
    shape = _ints(metadata.field("size"), "a ShardedTensor's size")
    if shape != shell.shape:
        raise Refusal(f"a ShardedTensor of size {shell.shape} whose metadata says {shape}")
    listed = metadata.field("shards_metadata")
    if not isinstance(listed, list) or not listed:
        raise Refusal("a ShardedTensor's metadata lists no shards")
    boxes = [_box(m) for m in listed]
    pieces, ranks = [], []
    for shard in state[0]:
        record = record_of(shard, "torch.distributed._shard.sharded_tensor.shard.Shard",
                           "a local shard")
        tensor = record.field("tensor")
        if not isinstance(tensor, TensorInfo):
            raise Refusal("a local shard without a tensor")
        offsets, sizes, rank = _box(record.field("metadata"))
        if sizes != tensor.shape or (offsets, sizes) not in [b[:2] for b in boxes]:
            raise Refusal(f"a local shard of shape {tensor.shape} at {offsets} disagrees "
                          "with the ShardedTensor's metadata")
        pieces.append(Piece(offsets, tensor))
        ranks.append(rank)
    world = max([len(boxes)] + [r + 1 for *_, r in boxes if r is not None])
    rank = next((r for r in ranks if r is not None), -1)
    group = _process_group(state[2] if len(state) > 2 else None)
    if group is not None:  # the ranks, not the shards: a rank may hold none (3 rows, 4 ranks)
        rank, world = group[0], max(world, group[1])
    spec = _spec(state[3] if len(state) > 3 else None, boxes)
    return ShardLayout(SHARDED_TENSOR, shape, shell.dtype, world, rank, tuple(pieces),
                       (f"{spec}({len(boxes)} shards)",), tuple((o, s) for o, s, _ in boxes))


def _process_group(value: Tree) -> tuple[int, int] | None:
    """The saving rank and the world size of the group a ShardedTensor is sharded over
    (``ShardedTensor.ProcessGroupState``), when it is the whole world; None for a subgroup
    (HYBRID_SHARD's), whose shards the placements alone place."""
    if value is None:
        return None
    state = value.state if isinstance(value, ObjectRecord) and value.name == _GROUP_STATE \
        else None  # getattr's stand-in, built from a dict
    fields = [state.get(n) for n in _GROUP_FIELDS] if isinstance(state, dict) else []
    ints = [f for f in fields if type(f) is int]
    if len(ints) != 4 or not (0 <= ints[0] < ints[2] and 0 <= ints[1] < ints[3]):
        raise Refusal("a ShardedTensor's process group state is not a ProcessGroupState "
                      "of ranks")
    local, _, size, world = ints
    return (local, size) if size == world else None


def _spec(value: Tree, boxes: list[tuple[tuple[int, ...], tuple[int, ...], int | None]]) -> str:
    """The sharding spec's name for reports. FSDP1 records a tensor held by one rank whole
    (one row over N ranks) as an ``EnumerableShardingSpec``: its shard list must be the
    metadata's own."""
    if isinstance(value, DataRecord) and value.record_name == _ENUMERABLE:
        listed = value.field("shards")
        if not isinstance(listed, list) or [_box(m) for m in listed] != boxes:
            raise Refusal("a ShardedTensor whose EnumerableShardingSpec lists other shards "
                          "than its metadata")
        return "EnumerableSharding"
    return "ChunkSharding"


_TENSOR_CLASSES = {name: data_class(name) for name in (DTENSOR, SHARDED_TENSOR)}


def distributed_table() -> dict[str, object]:
    """Qualified name -> what a pickle gets for it (the records of ``data_records`` too);
    merged into ``allowed.table``."""
    table = records_table((*_DTENSOR_PARTS, *_SHARDED_TENSOR_PARTS))
    table.update(_TENSOR_CLASSES)
    table[_WRAPPER] = Allowed(_WRAPPER, _wrapper)
    table[_FROM_TYPE] = Allowed(_FROM_TYPE, _from_type_distributed)
    return table
