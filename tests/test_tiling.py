"""The coverage proof and the assembled file, against brute force.

``check_tiling`` decides from corners whether pieces tile a tensor; here
every decision is checked against counting, element by element, how many
pieces hold each element, over random boxes in small frames (tilings,
and tilings with a piece dropped, doubled, moved, grown or cut), and the
element a refusal names is one that really is held twice or by none.
``GridFile`` is checked to give, for any byte range, the bytes numpy's
own assembly gives.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from ckptport.readers.assembled import (
    MAX_CUT_DIMS,
    Box,
    GridFile,
    TilingError,
    check_tiling,
)
from ckptport.tensors import Blob

WHERE = Path("t")


def _split(rng: random.Random, offsets: list[int], sizes: list[int], depth: int = 0
           ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A random tiling of a box: split along a random dimension, recursively."""
    dims = [d for d, n in enumerate(sizes) if n > 1]
    if not dims or depth > 3 or rng.random() < 0.25:
        return [(tuple(offsets), tuple(sizes))]
    d = rng.choice(dims)
    cut = rng.randrange(1, sizes[d])
    low, high = list(sizes), list(sizes)
    low[d], high[d] = cut, sizes[d] - cut
    moved = list(offsets)
    moved[d] += cut
    return _split(rng, offsets, low, depth + 1) + _split(rng, moved, high, depth + 1)


def _broken(rng: random.Random, frame: tuple[int, ...],
            boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]
            ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    boxes = list(boxes)
    how = rng.choice(["drop", "double", "move", "grow", "cut", "keep"])
    i = rng.randrange(len(boxes))
    offsets, sizes = (list(v) for v in boxes[i])
    d = rng.randrange(len(frame))
    if how == "drop":
        return boxes[:i] + boxes[i + 1:]
    if how == "double":
        return [*boxes, boxes[i]]
    if how == "move" and offsets[d] > 0:
        offsets[d] -= 1
    elif how == "grow" and offsets[d] + sizes[d] < frame[d]:
        sizes[d] += 1
    elif how == "cut" and sizes[d] > 1:
        sizes[d] -= 1
    boxes[i] = (tuple(offsets), tuple(sizes))
    return boxes


def _counts(frame: tuple[int, ...], boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]
            ) -> np.ndarray:
    counts = np.zeros(frame, dtype=int)
    for offsets, sizes in boxes:
        counts[tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))] += 1
    return counts


def test_the_corner_proof_agrees_with_counting():
    for seed in range(400):
        _agrees(seed)


def _agrees(seed: int) -> None:
    rng = random.Random(seed)
    frame = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 3)))
    boxes = _split(rng, [0] * len(frame), list(frame))
    if seed % 4:
        boxes = _broken(rng, frame, boxes)
    counts = _counts(frame, boxes)
    pieces = [(o, n, f"file{i}") for i, (o, n) in enumerate(boxes)]
    if (counts == 1).all():
        check_tiling("w", WHERE, frame, pieces)
        return
    with pytest.raises(TilingError) as raised:
        check_tiling("w", WHERE, frame, pieces)
    message = raised.value.message
    named = re.search(r"element (\(?[\d, ]+\)?) of", message)
    assert named, message
    element = eval(named[1])  # a tuple or an int, as the message prints it
    element = (element,) if isinstance(element, int) else element
    held = int(counts[element])
    assert held != 1, message
    if held:
        assert f"held by {held} pieces" in message and "overlapping" in message
    else:
        assert "no piece holds" in message


def test_pieces_past_the_tensor_and_too_many_cut_dimensions_are_refused():
    with pytest.raises(TilingError, match="reaches past"):
        check_tiling("w", WHERE, (4,), [((2,), (3,), "a")])
    frame = (2,) * (MAX_CUT_DIMS + 1)
    halves = [(tuple(1 if d == i else 0 for d in range(len(frame))), (1,) * len(frame), "a")
              for i in range(len(frame))]
    with pytest.raises(TilingError, match=f"at most {MAX_CUT_DIMS}"):
        check_tiling("w", WHERE, frame, halves)


def test_the_proof_costs_per_piece_not_per_element():
    """A column split of 10**12 rows is two pieces: proved at once."""
    rows = 10 ** 12
    check_tiling("w", WHERE, (rows, 2), [((0, 0), (rows, 1), "a"), ((0, 1), (rows, 1), "b")])
    with pytest.raises(TilingError, match=r"no piece holds element \(0, 1\)"):
        check_tiling("w", WHERE, (rows, 2), [((0, 0), (rows, 1), "a")])


def test_the_assembled_file_reads_every_range_as_numpy_assembles_it():
    for seed in range(60):
        _reads(seed)


def _reads(seed: int) -> None:
    rng = random.Random(seed)
    frame = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 4)))
    itemsize = rng.choice([1, 2, 4])
    truth = np.frombuffer(rng.randbytes(int(np.prod(frame)) * itemsize), dtype=np.uint8)
    grid = truth.reshape(*frame, itemsize)
    boxes = []
    for offsets, sizes in _split(rng, [0] * len(frame), list(frame)):
        part = grid[tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))]
        boxes.append(Box(offsets, sizes, Blob.of_bytes(part.tobytes()), 0, "f"))
    file = GridFile(WHERE, frame, itemsize, boxes)
    assert file.read(0, file.size) == truth.tobytes()
    for _ in range(20):
        start = rng.randrange(file.size)
        n = rng.randrange(file.size - start + 1)
        assert file.read(start, n) == truth[start:start + n].tobytes()
