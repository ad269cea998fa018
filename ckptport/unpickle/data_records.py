"""Allowed classes as inert records of plain data: DeepSpeed's, Megatron's, distributed parts.

DeepSpeed's rank files pickle its loss scaler, its ZeRO stage enum and
fragment addresses; Megatron-LM's ``args`` in a ``dist_checkpointing``
save's ``common.pt`` hold megatron's enums (``AttnBackend.auto``), each a
call with its value; a DTensor's or ShardedTensor's state names its mesh,
placements and shard metadata as instances of torch's classes. None of
these classes is imported: each is a ``DataRecord``, a stand-in whose
arguments and ``BUILD`` state are checked to be plain data (scalars,
containers of them, tensors, other records), so a pickle can hand it
nothing that runs. Reading a distributed tensor out of such records is
``distributed_values``'s: this module knows records, not tensors.
"""

from __future__ import annotations

from typing import ClassVar

from ..dtypes import DType
from ..tensors import TensorInfo
from ..tree import ObjectRecord, RecordKind, Tree
from .values import Allowed, Device, Marker, Recorded, Refusal, Size, _ReadOnlyType

__all__ = ["DataRecord", "data_class", "record_of", "slots_state", "records_table",
           "is_plain"]

_DEEPSPEED_PARTS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.checkpoint.utils.fragment_address",
)
# the enums Megatron-LM's args hold in a dist_checkpointing save's common.pt: a value each
_MEGATRON_ENUMS = (
    "megatron.core.enums.ModelType", "megatron.core.enums.Fp8Recipe",
    "megatron.core.enums.Fp4Recipe", "megatron.core.transformer.enums.ModelType",
    "megatron.core.transformer.enums.LayerType", "megatron.core.transformer.enums.AttnType",
    "megatron.core.transformer.enums.AttnMaskType",
    "megatron.core.transformer.enums.AttnBackend",
    "megatron.core.transformer.enums.CudaGraphScope",
)
_ZERO_STAGE = "deepspeed.runtime.zero.config.ZeroStageEnum"


def is_plain(value: object, depth: int = 0) -> bool:
    """Data a record's state may hold: scalars, containers of them, other records, tensors."""
    if depth > 16:
        return False
    if value is None or type(value) in (str, int, float, bool, bytes):
        return True
    if isinstance(value, (TensorInfo, Size, DType, Device, ObjectRecord, Marker)):
        return True
    if isinstance(value, type) and issubclass(value, Recorded) and not value.dangerous:
        return True  # an enum member fetched with getattr: an inert stand-in
    if type(value) is list or type(value) is tuple:
        return all(is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(type(k) in (str, int) and is_plain(v, depth + 1) for k, v in value.items())
    return False


def slots_state(state: Tree) -> Tree:
    """A pickled state as one dict where it is the ``(dict, slots)`` pair of a class with
    ``__slots__`` (records and tensor subclasses); any other state as it is."""
    if isinstance(state, tuple) and len(state) == 2 and (
            state[0] is None or isinstance(state[0], dict)) and isinstance(state[1], dict):
        return {**(state[0] or {}), **state[1]}
    return state


class _Discarded(list[Recorded]):
    """The registry of stand-ins made from a record's attribute (``getattr(ShardedTensor,
    "ProcessGroupState")``): class-level, so it keeps nothing; they are data, no verdict."""

    def append(self, value: Recorded) -> None:
        pass


class DataRecord(Recorded):
    """An instance of an allowed class: its arguments and state, checked plain.

    Made through ``__new__`` (``NEWOBJ``, a named tuple's arguments) or a
    call; ``BUILD`` takes a dict, or the ``(slots, dict)`` pair of classes
    with ``__slots__``. The real class is never imported.
    """

    registry: ClassVar[list[Recorded]] = _Discarded()  # what getattr's stand-ins make

    def __new__(cls, *args: Tree, **kwargs: Tree) -> DataRecord:
        if kwargs or not all(is_plain(a) for a in args):
            raise Refusal(f"{cls.record_name} takes plain values")
        self = object.__new__(cls)
        ObjectRecord.__init__(self, cls.record_name, RecordKind.INSTANCE, args, {})
        self.called, self.order = True, -1
        return self

    def __init__(self, *args: Tree, **kwargs: Tree) -> None:  # the call is __new__'s
        pass

    def __setstate__(self, state: Tree) -> None:
        state = slots_state(state)
        if isinstance(state, tuple) and is_plain(state):  # a __setstate__ taking a tuple
            self.state = state
            return
        if not (isinstance(state, dict) and all(type(k) is str for k in state)
                and is_plain(state)):
            raise Refusal(f"the state of {self.record_name} must be plain values")
        self.state = {**self.state, **state} if isinstance(self.state, dict) else state

    def field(self, name: str) -> Tree:
        return self.state.get(name) if isinstance(self.state, dict) else None


def data_class(name: str) -> type[DataRecord]:
    """The stand-in class a pickle gets for the allowed class ``name``."""
    short = name.rpartition(".")[2]
    made: type[DataRecord] = _ReadOnlyType(short, (DataRecord,), {  # type: ignore[assignment]
        "record_name": name, "__qualname__": short, "__module__": name.rpartition(".")[0]})
    return made


def record_of(value: Tree, name: str, what: str) -> DataRecord:
    """``value`` as the record of class ``name`` it must be; ``what`` names it if it is not."""
    if not (isinstance(value, DataRecord) and value.record_name == name):
        raise Refusal(f"{what} is not a {name.rpartition('.')[2]}")
    return value


def _zero_stage(value: object) -> int:
    """``ZeroStageEnum(2)``: the stage number is the data."""
    if type(value) is not int or not 0 <= value <= 3:
        raise Refusal("ZeroStageEnum takes a stage number 0..3")
    return value


def records_table(names: tuple[str, ...]) -> dict[str, object]:
    """Qualified name -> what a pickle gets for it: ``names`` (a caller's classes) and
    DeepSpeed's and Megatron's as records, ``ZeroStageEnum`` as its stage number."""
    table: dict[str, object] = {name: data_class(name) for name in (
        *names, *_DEEPSPEED_PARTS, *_MEGATRON_ENUMS)}
    table[_ZERO_STAGE] = Allowed(_ZERO_STAGE, _zero_stage)
    return table
