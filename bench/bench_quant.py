"""Benchmark ``normalize --dequantize bfloat16`` on an FP8 block-scaled checkpoint.

Makes (once; ``--keep`` keeps it for the next run) a DeepSeek-V3-style
checkpoint: ``float8_e4m3fn`` weights of 2048 x 7168 with float32
``weight_scale_inv`` over 128 x 128 blocks, and a bf16 norm per layer. Then
times two fresh processes, in one run: wall and CPU seconds, peak RSS and
peak private (anonymous) memory, sampled as ``bench/run.py`` does (a mapped
source counts in RSS but costs no memory):

- hand-written: what a user writes with public APIs: safetensors
  ``load_file``, the reference dequantization (transformers'
  ``Fp8Dequantize``) on every weight, ``save_file`` (not verified);
- ckptport: ``ckptport normalize SRC out.safetensors --dequantize bfloat16``
  (streamed one weight at a time, fsynced, verified: the file read back and
  every dequantized weight's bytes held to the CRC-32 of the bytes computed,
  every other tensor compared with the source read afresh).

Targets: ckptport no slower than the hand-written script, peak private
memory at most 0.1x its. Run from the repository root:

    python -m bench.bench_quant --size-gb 2

Data goes under bench/out/ (gitignored) and is deleted at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.run import measure

OUT = Path(__file__).with_name("out")
ROWS, COLUMNS, BLOCK = 2048, 7168, 128

HAND_WRITTEN = """
import sys, torch
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize
state = load_file(sys.argv[1])
reference = Fp8Dequantize(None)
out = {}
for name, tensor in state.items():
    if name.endswith("_scale_inv"):
        continue
    scale = state.get(name + "_scale_inv")
    out[name] = tensor if scale is None else reference._dequantize_one(
        tensor, scale, output_dtype=torch.bfloat16)
save_file(out, sys.argv[2])
"""


def make_fp8(size_gb: float, path: Path) -> Path:
    """An FP8 block-scaled checkpoint of about ``size_gb`` GB (random codes, no NaN codes)."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    count = max(1, round(size_gb * (1 << 30) / (ROWS * COLUMNS)))
    generator = torch.Generator().manual_seed(0)
    state = {}
    for i in range(count):
        codes = torch.randint(0, 256, (ROWS, COLUMNS), dtype=torch.uint8, generator=generator)
        codes[(codes & 0x7F) == 0x7F] = 0  # e4m3fn's NaN codes
        state[f"model.layers.{i}.mlp.down_proj.weight"] = codes.view(torch.float8_e4m3fn)
        state[f"model.layers.{i}.mlp.down_proj.weight_scale_inv"] = torch.rand(
            ROWS // BLOCK, COLUMNS // BLOCK, generator=generator) / 448
        state[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(
            COLUMNS, dtype=torch.bfloat16)
    save_file(state, str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="size of the FP8 source")
    parser.add_argument("--out", type=Path, default=OUT, help="where the files are written")
    parser.add_argument("--keep", action="store_true", help="keep the source for the next run")
    args = parser.parse_args()
    source = make_fp8(args.size_gb, args.out / f"fp8_{args.size_gb:g}gb.safetensors")
    hand, mine = args.out / "hand.safetensors", args.out / "ckptport.safetensors"
    try:
        subprocess.run(["cat", str(source)], stdout=subprocess.DEVNULL, check=True)  # cached
        runs = {
            "hand-written load_file + Fp8Dequantize + save_file": [
                sys.executable, "-c", HAND_WRITTEN, str(source), str(hand)],
            "ckptport normalize --dequantize bfloat16 (verified)": [
                sys.executable, "-m", "ckptport", "normalize", str(source), str(mine),
                "--dequantize", "bfloat16", "--overwrite", "-q"],
        }
        results = {name: measure(command) for name, command in runs.items()}
        for name, run in results.items():
            if run.rc:
                raise SystemExit(f"{name} failed: {run.stderr[-2000:]}")
        same = subprocess.run([sys.executable, "-m", "ckptport", "diff", str(hand), str(mine),
                               "-q"]).returncode == 0
        print(f"source: {source.name}, {source.stat().st_size / 1e9:.2f} GB; output "
              f"{mine.stat().st_size / 1e9:.2f} GB; outputs bit-identical: {same}")
        print("| command | wall s | cpu s | peak RSS MB | peak private MB |")
        print("|---|---:|---:|---:|---:|")
        for name, run in results.items():
            print(f"| {name} | {run.wall:.2f} | {run.cpu:.2f} | {run.rss_mb:.0f} | "
                  f"{run.private_mb:.0f} |")
        hand_run, mine_run = results.values()
        print(f"targets: time ratio {mine_run.wall / hand_run.wall:.2f} (<= 1; cpu "
              f"{mine_run.cpu / hand_run.cpu:.2f}), peak private memory ratio "
              f"{mine_run.private_mb / hand_run.private_mb:.3f} (<= 0.1)")
    finally:
        for path in (hand, mine) if args.keep else (hand, mine, source):
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
