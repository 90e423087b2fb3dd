"""Checkpoints both ways between attnzoo and the transformers layout: bit-exact round trips."""

import json

import pytest
import torch
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken

from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForImageClassification  # noqa: E402

import attnzoo  # noqa: E402
import attnzoo.hf as H  # noqa: E402
from attnzoo.models.config import SequenceClassifierConfig  # noqa: E402

TINY_LM = dict(dim=32, depth=2, heads=4, vocab_size=61, block_size=24)


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Move every parameter and buffer off its initial value, so a re-initialised load cannot pass."""
    with torch.no_grad():
        for t in list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]:
            t.add_(torch.rand_like(t) * 0.05)
    return model.eval()


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize(
    "name, overrides, tied",
    [
        ("tost_gpt_base", {}, True),
        ("aot_gpt_hybrid", {"ffn_layers": 1}, True),
        ("fastmax_gpt_p1", {"tie_weights": False, "pos_embed": "sinusoidal"}, False),
    ],
)
def test_lm_checkpoint_round_trip_through_transformers(tmp_path, name, overrides, tied):
    src = _perturb(attnzoo.create_model(name, **TINY_LM, **overrides))
    src.save_pretrained(tmp_path / "attnzoo")
    hf = H.attnzoo_to_hf(tmp_path / "attnzoo", tmp_path / "hf", eos_token_id=3)
    # the transformers checkpoint: model_type, the same fields, the model. prefix, the tied head stored once
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "attnzoo_causal_lm" and cfg["attention"] == src.config.attention
    assert cfg["eos_token_id"] == 3
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert all(k.startswith("model.") for k in keys)
    assert ("model.lm_head.weight" in keys) is not tied
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 61, (2, 7))
    assert torch.equal(loaded(ids).logits, src(ids))
    assert torch.equal(hf(ids).logits, src(ids))
    # and back: transformers directory -> attnzoo checkpoint, loadable without transformers' classes
    back = H.hf_to_attnzoo(tmp_path / "hf", tmp_path / "back")
    again = attnzoo.from_pretrained(tmp_path / "back")
    for m in (back, again):
        assert type(m) is type(src) and m.config == src.config
        _assert_same_state(m, src)
        assert (m.lm_head.weight is m.wte.weight) is tied
        assert torch.equal(m(ids), src(ids))


def test_vision_checkpoint_round_trip_through_transformers(tmp_path):
    # conv stem (BatchNorm buffers), LayerScale, class-attention pooling: every kind of tensor a classifier has
    src = _perturb(
        attnzoo.create_model("tost_t", dim=64, depth=2, heads=4, image_size=16, num_classes=7, class_attention_layers=1)
    )
    hf = H.attnzoo_to_hf(src, tmp_path / "hf", id2label={i: f"c{i}" for i in range(7)})
    assert hf.config.num_labels == 7 and hf.config.id2label[3] == "c3"
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded(pixel_values=x).logits, src(x))
    back = H.hf_to_attnzoo(loaded)
    assert back.config == src.config
    _assert_same_state(back, src)


def test_in_memory_conversion_keeps_training_mode_and_copies_weights():
    src = attnzoo.create_model("gpt2_base", **TINY_LM).train()
    hf = H.attnzoo_to_hf(src)
    assert hf.training
    _assert_same_state(hf.model, src)
    with torch.no_grad():
        hf.model.wte.weight.add_(1.0)
    assert not torch.equal(hf.model.wte.weight, src.wte.weight)  # a copy, not shared storage


def test_state_dict_converters():
    sd = {"wte.weight": torch.zeros(2), "lm_head.weight": torch.zeros(2), "blocks.0.attn.qkv.weight": torch.ones(3)}
    hf = H.state_dict_to_hf(sd, tied=("lm_head.weight",))
    assert set(hf) == {"model.wte.weight", "model.blocks.0.attn.qkv.weight"}
    back = H.state_dict_from_hf(hf, tied={"lm_head.weight": "wte.weight"})
    assert set(back) == set(sd) and back["lm_head.weight"] is back["wte.weight"]
    with pytest.raises(ValueError, match="already has the transformers prefix"):
        H.state_dict_to_hf(hf)
    with pytest.raises(ValueError, match="not an attnzoo transformers key"):
        H.state_dict_from_hf(sd)


def test_converters_reject_other_models():
    with pytest.raises(ValueError, match="only causal LMs and vision classifiers"):
        H.config_to_hf(SequenceClassifierConfig(dim=32, depth=1, heads=4))
    with pytest.raises(TypeError, match="AttnZooCausalLMConfig or AttnZooVisionConfig"):
        H.config_from_hf(SequenceClassifierConfig(dim=32, depth=1, heads=4))
    with pytest.raises(TypeError, match="attnzoo model"):
        H.attnzoo_to_hf(torch.nn.Linear(2, 2))
