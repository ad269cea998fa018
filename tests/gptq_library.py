"""GPTQModel's own dequantizers over GPTQ model folders: the oracle of ``tests/test_quantized``.

Run as ``python -m tests.gptq_library`` in its own process: importing gptqmodel takes
seconds and patches safetensors, transformers' GPTQ quantizer and triton for the rest of the
process, which the test process must not inherit. It imports gptqmodel first, then reads
folders from stdin, one a line, so the test session starts it early (``tests/conftest.py``)
and hands it the folders once built. For each folder (``model.safetensors`` with one linear
``m`` and a ``config.json`` ``quantization_config``) it writes ``library.safetensors``:

- ``module``: the weight ``(N, K)`` of gptqmodel's pure-torch ``TorchLinear`` loaded with the
  packs as its loader does (v1 zero points converted to v2 by
  ``convert_gptq_v1_to_v2_format_module`` first: the module computes in v2), in eval mode,
  read out by its ``dequantize_weight()`` (in the scales' dtype, float16), transposed;
- ``file``: what ``convert_gptq_file``, the per-file step of gptqmodel's
  ``dequantize_model``, gives for ``m.weight`` in float16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from gptqmodel.nn_modules.qlinear.torch import TorchLinear
from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module
from gptqmodel.utils.model_dequant import convert_gptq_file
from safetensors.torch import load_file, save_file


def dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """The two weights GPTQModel makes of the folder's packs."""
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    state = load_file(folder / "model.safetensors")
    bits, size = config["bits"], config["group_size"]
    outputs, inputs = state["m.scales"].shape[1], state["m.g_idx"].shape[0]
    module = TorchLinear(bits=bits, group_size=size, sym=config["sym"],
                         desc_act=config["desc_act"], in_features=inputs, out_features=outputs,
                         bias=False, register_buffers=True)
    for name in ("qweight", "qzeros", "scales", "g_idx"):
        getattr(module, name).data.copy_(state[f"m.{name}"])
    if config["checkpoint_format"] == "gptq":
        convert_gptq_v1_to_v2_format_module(module, bits=bits, pack_dtype=torch.int32)
    module.eval()
    with torch.no_grad():
        weight = module.dequantize_weight().T.contiguous()
    file = convert_gptq_file(folder / "model.safetensors", torch.float16, config, "cpu")
    return {"module": weight, "file": file["m.weight"].contiguous()}


if __name__ == "__main__":
    for line in sys.stdin:
        folder = Path(line.rstrip("\n"))
        save_file(dequantized(folder), folder / "library.safetensors")
