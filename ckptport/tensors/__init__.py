"""Tensor leaves and how their bytes are read: the one place that touches tensor data.

A tree's tensor leaves come in four kinds, and every consumer (writers,
verification, diff, ``check --finite``, the manifest) reads them through
the functions here, never by kind:

- ``TensorInfo``: a tensor the readers described, backed by a ``Blob``
  (a byte range of a source file, or bytes in memory); its bytes are read
  by position when needed, so nothing is loaded up front and a truncated
  source is an error rather than a crash;
- ``Pending``: a tensor computed when its bytes are needed, from another
  leaf: made contiguous and compact, and cast (``--dtype``). Rules return
  these instead of copying, so a cast of a 10 GB checkpoint holds one
  tensor at a time;
- ``Computed``: a tensor made from several leaves by a function (a
  dequantized weight from its codes and scales), one tensor at a time;
- torch tensors (``ckptport.read``, ``--trust``, DCP sources, API callers).

``chunks(leaf)`` yields a leaf's canonical bytes (contiguous, row-major,
little-endian) in bounded pieces; ``to_torch(leaf)`` makes a real tensor.

Two modules, one per question: ``leaves`` (the kinds, and what is asked of
a leaf without its bytes: storage identity and ties, sizes, compactness,
device) and ``data`` (its elements, through numpy and torch). Every name is
imported from here.
"""

from __future__ import annotations

from .data import CHUNK_BYTES, announce, chunks, file_range, realize, to_numpy, to_torch
from .leaves import (
    Blob,
    Computed,
    Pending,
    StorageInfo,
    TensorInfo,
    ViewKey,
    contiguous_strides,
    extent,
    group_by_storage,
    human_bytes,
    is_compact,
    location,
    nbytes,
    storage_key,
    storage_nbytes,
    view_key,
)

__all__ = ["Blob", "StorageInfo", "TensorInfo", "Pending", "Computed", "ViewKey", "view_key",
           "group_by_storage", "storage_key", "storage_nbytes", "nbytes", "is_compact",
           "location", "chunks", "to_torch", "to_numpy", "contiguous_strides", "human_bytes",
           "CHUNK_BYTES", "extent", "realize", "file_range", "announce"]
