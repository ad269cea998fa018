"""load_into with real models: recipes into another architecture's names, a detector
backbone, meta-device models, new heads.

The models are real ``transformers`` classes (tiny random configs, written by
``save_pretrained``). The renaming pair is BERT -> RoBERTa: the two compute the
same function given the same ``position_ids`` and differ only in module names
(``bert.`` / ``roberta.``, ``cls.predictions.transform.*`` / ``lm_head.*``);
GPT-2 -> Llama would not (Conv1D vs Linear, learned positions vs rotary), so no
renaming could make their logits agree. ResNet backbones come from transformers
too (``ResNetBackbone``, what its DETR-style detectors use; timm cannot be
installed beside this torch).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import ckptport
from ckptport.errors import StateDictMismatchError

transformers = pytest.importorskip("transformers")

BERT_TO_ROBERTA = r"""
# a BERT pretraining checkpoint as RoBERTa masked-LM weights
steps = [
  { drop = ["bert.pooler.*", "cls.seq_relationship.*"] },
  { rename = ['^bert\.', 'roberta.'] },
  { rename = ['^cls\.predictions\.transform\.LayerNorm\.', 'lm_head.layer_norm.'] },
  { rename = ['^cls\.predictions\.(?:transform\.)?(dense|decoder|bias)', 'lm_head.\1'] },
]
"""

SIZES = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 37, "max_position_embeddings": 40, "type_vocab_size": 1}


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hub")
    torch.manual_seed(0)
    bert = transformers.BertForPreTraining(transformers.BertConfig(**SIZES)).eval()
    bert.save_pretrained(folder / "bert")
    (folder / "bert_to_roberta.toml").write_text(BERT_TO_ROBERTA)
    resnet_config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32],
                                              depths=[1, 1, 1, 1], num_labels=10)
    classifier = transformers.ResNetForImageClassification(resnet_config).eval()
    with torch.no_grad():  # running stats that are not the defaults, so loading shows
        for module in classifier.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    classifier.save_pretrained(folder / "resnet")
    return {"bert": folder / "bert", "recipe": folder / "bert_to_roberta.toml",
            "resnet": folder / "resnet", "dir": folder}


def test_recipe_makes_bert_weights_load_as_roberta_with_the_same_logits(run, hub, tmp_path):
    out = tmp_path / "roberta"
    out.mkdir()
    result = run("normalize", hub["bert"] / "model.safetensors", out / "model.safetensors",
                 "--map", hub["recipe"])
    assert result.exit_code == 0, result.stderr
    transformers.RobertaConfig(**SIZES, pad_token_id=1).save_pretrained(out)
    roberta, info = transformers.RobertaForMaskedLM.from_pretrained(out,
                                                                    output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    bert = transformers.BertForPreTraining.from_pretrained(hub["bert"]).eval()
    roberta.eval()
    ids = torch.tensor([[5, 17, 42, 3, 98, 7], [2, 9, 9, 61, 0, 33]])
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        want = bert(input_ids=ids, position_ids=positions).prediction_logits
        got = roberta(input_ids=ids, position_ids=positions).logits
    assert torch.equal(want, got)


def test_detector_backbone_from_a_classifier_loads_strict(hub, tmp_path, run):
    """--subtree resnet --drop the last stage: the weights of a 3-stage backbone."""
    out = tmp_path / "backbone.safetensors"
    result = run("normalize", hub["resnet"] / "model.safetensors", out, "--subtree", "resnet",
                 "--drop", "encoder.stages.3.*")
    assert result.exit_code == 0, result.stderr
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24],
                                       depths=[1, 1, 1], out_features=["stage1", "stage2",
                                                                       "stage3"])
    backbone = transformers.ResNetBackbone(config).eval()
    from safetensors.torch import load_file

    backbone.load_state_dict(load_file(out), strict=True)
    classifier = transformers.ResNetForImageClassification.from_pretrained(hub["resnet"]).eval()
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        maps = backbone(pixels).feature_maps
        hidden = classifier(pixels, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(maps, hidden[1:4], strict=True))
    # the same through load_into, with the steps as keywords
    fresh = transformers.ResNetBackbone(config).eval()
    result = ckptport.load_into(fresh, hub["resnet"] / "model.safetensors", subtree="resnet",
                                drop=["encoder.stages.3.*"])
    assert result.loaded == len(fresh.state_dict()) and not result.missing
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(fresh(pixels).feature_maps, maps,
                                                     strict=True))


def test_meta_model_gets_the_weights_and_matches_an_eager_load(hub):
    path = hub["resnet"] / "model.safetensors"
    config = transformers.ResNetConfig.from_pretrained(hub["resnet"])
    eager = transformers.ResNetForImageClassification(config).eval()
    assert ckptport.load_into(eager, path).loaded == len(eager.state_dict())
    with torch.device("meta"):
        lazy = transformers.ResNetForImageClassification(config)
    result = ckptport.load_into(lazy, path)
    lazy.eval()
    assert result == ckptport.commands.load.LoadResult((), (), (), len(eager.state_dict()))
    assert not any(t.is_meta for t in [*lazy.parameters(), *lazy.buffers()])
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(lazy(pixels).logits, eager(pixels).logits)


class TiedNet(nn.Module):
    """An embedding tied to the output layer, a norm with buffers, a head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, classes)
        self.out = nn.Linear(8, 7, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norm(self.emb(x))
        return self.head(h), self.out(h)


@pytest.fixture(scope="session")
def tied_net(tmp_path_factory: pytest.TempPathFactory) -> tuple[TiedNet, Path]:
    torch.manual_seed(3)
    net = TiedNet().eval()
    with torch.no_grad():
        net.norm.running_mean.uniform_(-1, 1)
    path = tmp_path_factory.mktemp("tied") / "net.safetensors"  # hub style: out.weight left out
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in net.state_dict().items() if k != "out.weight"},
              path)
    return net, path


def test_meta_model_keeps_its_ties_on_the_device_and_dtype_asked(tied_net):
    net, path = tied_net
    with torch.device("meta"):
        lazy = TiedNet()
    result = ckptport.load_into(lazy, path, dtype=torch.float64, device="cpu")
    assert result.loaded == 9 and not result.missing  # out.weight filled by its tie
    assert lazy.out.weight is lazy.emb.weight  # still one parameter
    assert lazy.emb.weight.dtype == torch.float64 and lazy.norm.num_batches_tracked.dtype == \
        torch.int64
    lazy.eval()
    x = torch.tensor([1, 2, 6])
    with torch.no_grad():
        for a, b in zip(lazy(x), net.double()(x), strict=True):
            assert torch.equal(a, b)
    net.float()


def test_a_new_head_is_named_or_skipped(tied_net):
    _, path = tied_net
    with pytest.raises(StateDictMismatchError) as err:
        ckptport.load_into(TiedNet(classes=3), path, strict=False)
    assert "head.weight: checkpoint [10, 8], model [3, 8]" in str(err.value)
    assert "ignore_mismatched_sizes=True" in str(err.value)
    model = TiedNet(classes=3)
    head = model.head.weight.detach().clone()
    result = ckptport.load_into(model, path, ignore_mismatched_sizes=True)
    assert result.mismatched == (("head.weight", (10, 8), (3, 8)), ("head.bias", (10,), (3,)))
    assert result.loaded == 7 and not result.missing
    assert torch.equal(model.head.weight, head)  # the model's own head is kept
    with torch.device("meta"):
        lazy = TiedNet(classes=3)
    result = ckptport.load_into(lazy, path, ignore_mismatched_sizes=True)
    assert set(result.missing) == {"head.weight", "head.bias"}  # still on meta: listed
    assert lazy.head.weight.is_meta and not lazy.emb.weight.is_meta


def test_a_new_classifier_head_on_a_real_model(hub):
    config = transformers.ResNetConfig.from_pretrained(hub["resnet"])
    config.num_labels = 3
    model = transformers.ResNetForImageClassification(config)
    result = ckptport.load_into(model, hub["resnet"] / "model.safetensors",
                                ignore_mismatched_sizes=True)
    assert [m[0] for m in result.mismatched] == ["classifier.1.weight", "classifier.1.bias"]
    source = transformers.ResNetForImageClassification.from_pretrained(hub["resnet"])
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.state_dict().items()
               if not k.startswith("classifier."))


def test_buffers_no_checkpoint_holds_are_reported_on_meta(hub):
    """BERT's position_ids is a non-persistent buffer: built on meta it cannot be filled."""
    config = transformers.BertConfig(**SIZES)
    with torch.device("meta"):
        model = transformers.BertForPreTraining(config)
    with pytest.raises(StateDictMismatchError, match="still on meta.*position_ids"):
        ckptport.load_into(model, hub["bert"] / "model.safetensors")
    with torch.device("meta"):
        model = transformers.BertForPreTraining(config)
    result = ckptport.load_into(model, hub["bert"] / "model.safetensors", strict=False)
    left = {n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta}
    assert left and left <= set(result.missing)


def test_a_load_that_loads_nothing_is_an_error(tied_net):
    _, path = tied_net
    with pytest.raises(ckptport.CkptportError, match="give a floating-point torch.dtype"):
        ckptport.load_into(TiedNet(), path, dtype=torch.int64)
    with pytest.raises(ckptport.CkptportError, match="cannot move the model to nowhere"):
        ckptport.load_into(TiedNet(), path, device="nowhere")
    with pytest.raises(StateDictMismatchError, match="filled no tensor"):
        ckptport.load_into(nn.Linear(2, 2), path, strict=False)
