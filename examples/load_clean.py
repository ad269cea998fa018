"""Show what ckptport fixed: the raw GPU/DDP checkpoint vs the normalized files.

Run by ``make demo`` after ``ckptport normalize``; uses only public torch and
safetensors APIs, on a CPU-only machine.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import load_file

from fixtures.models import TinyNet

raw, pth, st = sys.argv[1:4]

try:
    torch.load(raw, weights_only=True)
except Exception as exc:  # the point of the demo: show how the raw file fails
    print(f"raw    {raw}: torch.load(weights_only=True) fails: {str(exc).splitlines()[0][:90]}")

state = torch.load(pth, weights_only=True)  # no map_location needed
TinyNet().load_state_dict(state, strict=True)
print(f"clean  {pth}: torch.load(weights_only=True) OK, {len(state)} tensors on "
      f"{sorted({str(t.device) for t in state.values()})}, load_state_dict(strict=True) OK")

tensors = load_file(st)
TinyNet().load_state_dict(tensors, strict=True)
same = all(torch.equal(tensors[k], state[k]) for k in state)
print(f"clean  {st}: safetensors load_file OK, load_state_dict(strict=True) OK, "
      f"identical to the .pth: {same}")
