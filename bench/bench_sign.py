"""Benchmark ``ckptport sign`` and ``ckptport verify`` against ``ckptport manifest``.

Signing hashes the files (the OMS signature, by ``model_signing``) and the
tensors (the weights attestation) in one run: the target is at most 1.1×
``ckptport manifest`` of the same model. A ~2 GB model folder (a
``model.safetensors`` of many tensors and its ``config.json``) is signed with
an ECDSA P-256 key made here; each command is a fresh process, the rows are
interleaved run by run (these machines are shared and noisy) and the best of
``--runs`` is kept. Run from the repository root:

    python -m bench.bench_sign --size-gb 2

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).with_name("out") / "sign"
TENSOR_BYTES = 32 << 20


def make(folder: Path, size_gb: float) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    count = max(1, int(size_gb * (1 << 30) / TENSOR_BYTES))
    state = {f"model.layers.{i}.weight": torch.full((TENSOR_BYTES // 4,), float(i))
             for i in range(count)}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "bench"}))
    return folder


def keys(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "key.pem", folder / "key.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the child) of one fresh process."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.decode()[-2000:]}")
    return wall, (after.children_user - before.children_user
                  + after.children_system - before.children_system)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    model = make(OUT / "model", args.size_gb)
    private, public = keys(OUT)
    ck = [sys.executable, "-m", "ckptport"]
    converted = OUT / "converted.pth"
    subprocess.run([*ck, "normalize", str(model), str(converted), "-q"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([*ck, "sign", str(model), "--key", str(private), "-q"], check=True,
                   stdout=subprocess.DEVNULL)  # the signatures verify reads
    signature = model / "model.sig"
    rows = {
        "`python -c 'import model_signing'` (import floor)":
            [sys.executable, "-c", "import model_signing.signing"],
        "**`ckptport manifest DIR`** (the baseline)":
            [*ck, "manifest", str(model), "-q", "-o", str(OUT / "m.json"), "--overwrite"],
        "**`ckptport sign DIR`** (OMS sha256 + attestation)":
            [*ck, "sign", str(model), "--key", str(private), "-q", "--overwrite",
             "-o", str(OUT / "a.sig")],
        "`ckptport sign DIR --file-hash blake3`":
            [*ck, "sign", str(model), "--key", str(private), "-q", "--overwrite",
             "--file-hash", "blake3", "-o", str(OUT / "b.sig")],
        "`ckptport sign DIR --weights-only`":
            [*ck, "sign", str(model), "--key", str(private), "-q", "--overwrite",
             "--weights-only", "-o", str(OUT / "c.sig")],
        "**`ckptport verify DIR`** (files + weights)":
            [*ck, "verify", str(model), "--public-key", str(public), "-q"],
        "`ckptport verify converted.pth --signature DIR/model.sig` (weights)":
            [*ck, "verify", str(converted), "--signature", str(signature), "--public-key",
             str(public), "-q"],
    }
    size = (model / "model.safetensors").stat().st_size
    print(f"model: {size:,} bytes, {os.cpu_count()} cores")
    best: dict[str, tuple[float, float]] = {}
    try:
        for _ in range(args.runs):
            for label, command in rows.items():
                wall, cpu = timed(command)
                if label not in best or wall < best[label][0]:
                    best[label] = (wall, cpu)
        base = best["**`ckptport manifest DIR`** (the baseline)"][0]
        print("| command | wall s | cpu s | × manifest |\n|---|---:|---:|---:|")
        for label, (wall, cpu) in best.items():
            print(f"| {label} | {wall:.2f} | {cpu:.2f} | {wall / base:.2f}× |")
    finally:
        shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    main()
