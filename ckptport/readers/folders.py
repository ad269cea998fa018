"""The layouts of model folders, and of folders that hold several checkpoints.

Every command asks the readers' layouts (``readers.layout_of``, in
``READERS`` order) what a folder names; the layouts of files that a
library's reader loads one at a time live here:

- a model folder with one weights file under a name its library gives it:
  Hugging Face ``model.safetensors``/``pytorch_model.bin``, diffusers
  ``diffusion_pytorch_model.*``, peft ``adapter_model.*`` (``config.json``,
  tokenizer files and the like beside it are named by the layout, and hold
  no checkpoint);
- an accelerate ``save_state`` folder: its ``model.safetensors`` sits beside
  ``optimizer.bin``, ``random_states_0.pkl`` and more, each a checkpoint of its
  own, which reading the folder as the model alone would silently leave out:
  a folder of checkpoints, read one file at a time (folder mode), which skips
  the files that hold no model weights (optimizer, scheduler, RNG state)
  unless ``--select all``.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from ..errors import InputError
from .base import Layout, Names, Where

__all__ = ["ModelFolder", "TrainingState", "listing", "not_one_checkpoint", "WEIGHT_FILES",
           "TRAINING_STATE"]

# a library's weights file in a model folder, by the name the library gives it
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "diffusion_pytorch_model.safetensors",
                "diffusion_pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
# what accelerate's save_state writes beside the model: checkpoints of their own, all but
# the registered objects (custom_checkpoint_N.pkl: an EMA model, say) without model weights
UNWEIGHTED = ("optimizer*.bin", "optimizer*.pt", "scheduler*.bin", "scheduler*.pt",
              "sampler*.bin", "random_states_*.pkl", "scaler*.pt")
TRAINING_STATE = (*UNWEIGHTED, "custom_checkpoint_*.pkl")
# what a model folder holds beside its weights: configs, tokenizers, cards, code
COMPANIONS = ("*.json", "*.md", "*.txt", "*.model", "*.yaml", "*.yml", "*.py", "*.jinja",
              "*.tiktoken", ".gitattributes", "LICENSE*")


def listing(folder: Path) -> frozenset[str]:
    """``folder``'s entries by name, folders with a trailing ``/`` (what layouts decide from)."""
    try:
        return frozenset(p.name + "/" if p.is_dir() else p.name for p in folder.iterdir())
    except OSError as exc:
        raise InputError.from_os_error(exc, folder) from None


def _companions(folder: Where, names: frozenset[str], taken: str
                ) -> tuple[Where, ...]:
    return tuple(folder / n for n in sorted(names) if n != taken and _matches(n, COMPANIONS))


class ModelFolder:
    """A model folder: its one weights file (safetensors first, as libraries load it)."""

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        chosen = next((n for n in WEIGHT_FILES if names is not None and n in names), None)
        if chosen is None:
            return None
        return Layout(folder / chosen, (folder / chosen,), quiet=_companions(folder, names or
                                                                             frozenset(), chosen))


class TrainingState:
    """An accelerate ``save_state`` folder: the model beside the training state, a folder of
    checkpoints."""

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        state = _training_state(names or frozenset())
        if not state:
            return None
        models = [n for n in WEIGHT_FILES if names is not None and n in names]
        shown = [*models, *state]
        unweighted = tuple(folder / n for n in state if _matches(n, UNWEIGHTED))
        return Layout(folder, (), unweighted=unweighted, many=(
            f"is a folder of checkpoints (an accelerate save_state folder: "
            f"{', '.join(shown[:5])}{' …' if len(shown) > 5 else ''}): name the one to read "
            f"(e.g. {folder / shown[0]}); check and normalize also take a folder of checkpoints "
            "whole"))


def _training_state(names: frozenset[str]) -> list[str]:
    return sorted(n for n in names if _matches(n, TRAINING_STATE))


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def not_one_checkpoint(folder: Where, names_in: frozenset[str] | None = None) -> InputError:
    """Why a folder that no layout names cannot be read as one checkpoint: what it holds
    (``names_in``: a remote folder's listing; a local one is listed here), and what to do
    that fits every command that reads one checkpoint."""
    names = sorted(names_in if names_in is not None else
                   listing(folder) if isinstance(folder, Path) else ())
    held = (f"it holds {', '.join(names[:5])}{' …' if len(names) > 5 else ''} "
            f"({len(names)} {'entry' if len(names) == 1 else 'entries'})" if names
            else "it is empty")
    pick = f" (e.g. {folder / names[0].rstrip('/')})" if names else ""
    return InputError(
        f"is a directory with no checkpoint named as one in it: {held}; no *.index.json "
        "shard index, model.safetensors/pytorch_model.bin, diffusion_pytorch_model.*, "
        "adapter_model.*, DCP .metadata, DeepSpeed or rank files. Name a file in it"
        f"{pick}; check and normalize also take a folder of checkpoints whole", folder)
