"""``ckptport.load_into`` with the shipped GPU-saved DDP fixture, into wrapped and bare models."""

from __future__ import annotations

from torch import nn

import ckptport
from fixtures.models import TinyNet

for model in (TinyNet(), nn.DataParallel(TinyNet())):
    print(type(model).__name__, ckptport.load_into(model, "fixtures/ddp_cuda3.pth"))
