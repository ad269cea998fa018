"""What a folder names: one checkpoint laid out in files, or a folder of checkpoints.

Every command asks this of a folder path, and they must agree: ``normalize``
reads one checkpoint or runs folder mode, ``inspect`` and ``check`` read one
or search many. So the answer has one home, here, used by ``resolve`` and the
CLI alike. A folder is one checkpoint when it is

- a ``torch.distributed.checkpoint`` folder (``.metadata``, ``*.distcp``);
- a DeepSpeed save or tag folder, or a folder of per-rank files;
- a shard set (one ``*.index.json``);
- a model folder with one weights file under a name its library gives it:
  Hugging Face ``model.safetensors``/``pytorch_model.bin``, diffusers
  ``diffusion_pytorch_model.*``, peft ``adapter_model.*`` (``config.json``,
  tokenizer files and the like beside it are not checkpoints);

and a folder of checkpoints otherwise, notably an accelerate ``save_state``
folder: its ``model.safetensors`` sits beside ``optimizer.bin``,
``random_states_0.pkl`` and more, each a checkpoint of its own, which
reading the folder as the model alone would silently leave out.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from pathlib import Path

from ..containers.shard_index import find_index
from ..errors import InputError, OptionError
from .dcp import is_dcp
from .deepspeed import is_deepspeed
from .ranks import rank_files

__all__ = ["FolderKind", "folder_kind", "tag_for", "tag_somewhere", "weights_file",
           "not_one_checkpoint", "WEIGHT_FILES", "TRAINING_STATE"]

# a library's weights file in a model folder, by the name the library gives it
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "diffusion_pytorch_model.safetensors",
                "diffusion_pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
# what accelerate's save_state writes beside the model: checkpoints of their own
TRAINING_STATE = ("optimizer*.bin", "optimizer*.pt", "scheduler*.bin", "scheduler*.pt",
                  "sampler*.bin", "random_states_*.pkl", "scaler*.pt", "custom_checkpoint_*.pkl")


class FolderKind(enum.Enum):
    DCP = "dcp"
    DEEPSPEED = "deepspeed"
    RANKS = "rank files"
    SHARDS = "shard set"
    WEIGHTS = "model folder"
    CHECKPOINTS = "folder of checkpoints"


def folder_kind(folder: Path) -> FolderKind:
    """What ``folder`` holds, decided from its names only (nothing is opened)."""
    if is_dcp(folder):
        return FolderKind.DCP
    if is_deepspeed(folder):
        return FolderKind.DEEPSPEED
    if rank_files(folder) is not None:
        return FolderKind.RANKS
    if _training_state(folder):
        return FolderKind.CHECKPOINTS
    if find_index(folder) is not None:
        return FolderKind.SHARDS
    if any((folder / name).exists() for name in WEIGHT_FILES):
        return FolderKind.WEIGHTS
    return FolderKind.CHECKPOINTS


def tag_somewhere(paths: Iterable[object], tag: str | None) -> None:
    """Refuse ``--tag`` when none of ``paths`` is a DeepSpeed save folder: each would be
    read as it is, and the run would pass for the tag the user named."""
    if tag is not None and not any(isinstance(p, (str, os.PathLike)) and tag_for(Path(p), tag)
                                   for p in paths):
        raise OptionError(f"--tag {tag}: no path given is a DeepSpeed checkpoint folder")


def tag_for(path: Path, tag: str | None) -> str | None:
    """``--tag`` where it applies: a DeepSpeed save folder (any other path reads as is)."""
    return tag if tag is not None and path.is_dir() and \
        folder_kind(path) is FolderKind.DEEPSPEED else None


def _training_state(folder: Path) -> list[str]:
    return sorted({p.name for pattern in TRAINING_STATE for p in folder.glob(pattern)})


def weights_file(folder: Path) -> Path:
    """The one weights file of a model folder (safetensors first, as libraries load it)."""
    for name in WEIGHT_FILES:
        if (folder / name).exists():
            return folder / name
    raise not_one_checkpoint(folder)


def not_one_checkpoint(folder: Path) -> InputError:
    """Why a folder cannot be read as one checkpoint, and what to do instead."""
    state = _training_state(folder)
    if state:
        models = [name for name in WEIGHT_FILES if (folder / name).exists()]
        return InputError(
            f"is a folder of checkpoints (an accelerate save_state folder: "
            f"{', '.join([*models, *state][:5])}{' …' if len(models) + len(state) > 5 else ''})"
            f": name the one to read (e.g. {folder / (models or state)[0]}), or normalize the "
            "folder to a folder DST (folder mode)", folder)
    return InputError(
        "is a directory with no checkpoint named as one in it (no *.index.json shard index, "
        "no model.safetensors/pytorch_model.bin, diffusion_pytorch_model.* or "
        "adapter_model.*, no DCP .metadata, no DeepSpeed or rank files): name a file, or "
        "normalize the folder to a folder DST (folder mode)", folder)
