"""Benchmark the key-surgery rules (``--subtree``, ``--drop``, ``--rename``) on many keys.

Key surgery works on names only, so its cost grows with the number of keys,
not the bytes: this times the three rules on a state dict of ``--keys``
names (one shared tensor), best of ``--runs``, in process. Run from the
repository root:

    python -m bench.bench_keys --keys 100000
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from pathlib import Path

import torch

from ckptport.checkpoint import Checkpoint, Format, SourceFacts
from ckptport.rules import NormalizeOptions
from ckptport.rules.recipes import key_rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    shared = torch.zeros(1)
    state = OrderedDict((f"backbone.blocks.{i // 10}.layer{i % 10}.weight", shared)
                        for i in range(args.keys))
    state._metadata = OrderedDict((f"backbone.blocks.{i}", {"version": 1})
                                  for i in range(args.keys // 10))
    source = Checkpoint(state, SourceFacts(Path("bench.pth"), Format.TORCH_ZIP, 0))
    options = NormalizeOptions(subtree="backbone", drop=("*.layer9.*",),
                               rename=((r"^blocks\.(\d+)\.", r"layers.\1."),))
    times = []
    for _ in range(args.runs):
        checkpoint = source
        start = time.perf_counter()
        for rule in key_rules(options.key_steps):
            checkpoint, _ = rule(checkpoint)
        times.append(time.perf_counter() - start)
    per_key = min(times) / args.keys * 1e6
    print(f"subtree + drop + rename: {args.keys} keys in, {len(checkpoint.tree)} out, "
          f"best {min(times):.2f} s ({per_key:.1f} µs per key for the three steps)")


if __name__ == "__main__":
    main()
