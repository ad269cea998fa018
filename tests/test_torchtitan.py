"""torchtitan's flattened DCP save: the model's FQNs at the root, beside the optimizer state
torch flattens for it (``get_optimizer_state_dict(flatten_optimizer_state_dict=True)``),
the scheduler, the dataloader and the train state, written by ``torch.distributed.checkpoint``
(torch 2.13) as torchtitan's checkpointer lays it out."""

from __future__ import annotations

import warnings

import torch

import ckptport
from tests.helpers import same_bits


def _titan(folder, extra=None):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    weights = {k: v.clone() for k, v in get_model_state_dict(model).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flat = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
            flatten_optimizer_state_dict=True))
        dcp.save({**get_model_state_dict(model), "optimizer": flat,
                  "lr_scheduler": scheduler.state_dict(), "dataloader": {"position": 8},
                  "train_state": {"step": 1}, **(extra or {})}, checkpoint_id=str(folder),
                 no_dist=True)
    return weights


def test_the_model_is_picked_beside_its_flattened_training_state(tmp_path, run):
    weights = _titan(tmp_path / "step-1")
    out = tmp_path / "model.pth"
    result = run("normalize", tmp_path / "step-1", out)
    assert result.exit_code == 0, result.stderr
    assert "flattened into the root" in result.stdout and "optimizer" in result.stdout
    got = torch.load(out, weights_only=True)
    assert list(got) == list(weights) and all(same_bits(got[k], v) for k, v in weights.items())
    assert list(ckptport.load_state_dict(tmp_path / "step-1")) == list(weights)


def test_an_unknown_entry_beside_the_root_tensors_is_not_guessed(tmp_path, run):
    """A dict of tensors under a name that is no trainer's state may be weights (an EMA):
    not left out silently."""
    _titan(tmp_path / "step-1", {"ema": {"0.weight": torch.zeros(3, 4)}})
    result = run("normalize", tmp_path / "step-1", tmp_path / "model.pth")
    assert "flattened into the root" not in result.stdout + result.stderr
