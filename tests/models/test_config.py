"""Configs: JSON round trips, strict keys, validation, registry errors and overrides."""

import json

import pytest
from models_helpers import tiny_overrides

from attnzoo.models import (
    CausalLMConfig,
    ICLConfig,
    SequenceClassifierConfig,
    VisionConfig,
    create_model,
    get_config,
    list_models,
    register_model,
)
from attnzoo.models.config import config_class_for


@pytest.mark.parametrize("name", list_models())
def test_json_round_trip(name):
    cfg = get_config(name)
    text = cfg.to_json()
    data = json.loads(text)
    assert data["arch"] == cfg.arch
    back = config_class_for(data["arch"]).from_json(text)
    assert back == cfg
    assert back.to_dict() == cfg.to_dict()


def test_tuples_become_lists_so_round_trips_are_exact():
    cfg = get_config("cbt_t", attention_options={"rep_grid": (4, 4)})
    assert cfg.attention_options == {"rep_grid": [4, 4]}
    assert VisionConfig.from_json(cfg.to_json()) == cfg
    # and the mechanism still gets a tuple
    model = create_model("cbt_t", **tiny_overrides("cbt_t", attention_options={"rep_grid": (4, 4)}))
    assert model.blocks[0].attn.rep_grid == (4, 4)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown VisionConfig key\(s\) \['dimension'\].*valid keys: \[.*'dim'"):
        VisionConfig.from_dict({"dimension": 3})
    with pytest.raises(ValueError, match=r"unknown CausalLMConfig key\(s\) \['n_embd'\]; valid keys"):
        create_model("gpt2_base", n_embd=64)
    with pytest.raises(ValueError, match="does not match VisionConfig"):
        VisionConfig.from_dict({"arch": "causal_lm"})
    with pytest.raises(ValueError, match="unknown model arch"):
        config_class_for("nope")


def test_unknown_model_name():
    with pytest.raises(ValueError, match=r"unknown model 'tost_xl'.*valid names: \["):
        create_model("tost_xl")
    with pytest.raises(ValueError, match="unknown model"):
        get_config(None)


def test_unknown_attention_and_option():
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        create_model("vit_s", attention="flash", **tiny_overrides("vit_s"))
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['bogus'\]"):
        create_model("vit_s", attention_options={"bogus": 1}, **tiny_overrides("vit_s"))


@pytest.mark.parametrize(
    "cls,kwargs,match",
    [
        (VisionConfig, dict(dim=30, heads=4), "divisible by heads"),
        (VisionConfig, dict(norm="sandwich"), r"norm='sandwich' is not supported; valid choices"),
        (VisionConfig, dict(ffn="moe"), "ffn='moe'"),
        (VisionConfig, dict(pool="max"), "pool='max'"),
        (VisionConfig, dict(image_size=30, patch_size=16), "divisible by patch_size"),
        (VisionConfig, dict(patch_embed="conv", patch_size=6, image_size=36), "power of two"),
        (VisionConfig, dict(depth=0), "depth must be a positive integer"),
        (VisionConfig, dict(dropout=1.0), "dropout must be a probability"),
        (VisionConfig, dict(ffn="ista", norm="post"), "ffn='ista' needs norm"),
        (VisionConfig, dict(ffn_layers=13, depth=12), r"ffn_layers=13 must be in \[0, depth=12\]"),
        (VisionConfig, dict(second_attention="cbsa", second_attention_from=20), "second_attention_from=20"),
        (VisionConfig, dict(layerscale=0.0), "layerscale must be"),
        (VisionConfig, dict(attention_options=[1]), "attention_options must be a dict"),
        (VisionConfig, dict(attention_options={"x": object()}), "JSON-serialisable"),
        (VisionConfig, dict(attention=3), "mechanism name"),
        (CausalLMConfig, dict(vocab_size=0), "vocab_size must be a positive integer"),
        (CausalLMConfig, dict(pos_embed="rope"), "pos_embed='rope'"),
        (SequenceClassifierConfig, dict(pool="last"), "pool='last'"),
        (ICLConfig, dict(n_dims=0), "n_dims must be a positive integer"),
    ],
)
def test_invalid_values(cls, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        cls(**kwargs)


def test_attention_override_resets_mechanism_options():
    cfg = get_config("csp_vit_cifar", attention="softmax")
    assert cfg.attention == "softmax" and cfg.attention_options == {}
    cfg = get_config("csp_vit_cifar", attention="softmax", attention_options={"qkv_bias": False})
    assert cfg.attention_options == {"qkv_bias": False}
    # same mechanism: options kept
    assert get_config("csp_vit_cifar", attention="csp").attention_options["groups"] == 32


def test_register_model_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        register_model("vit_s")(lambda: VisionConfig())


def test_hybrid_layout():
    cfg = get_config("crate_cbt_s")
    assert cfg.mechanisms() == ["mssa"] * 6 + ["cbsa"] * 6
    cfg = get_config("aot_gpt_hybrid")
    assert cfg.ffn_kinds() == ["mlp"] * 6 + ["none"] * 6
    assert get_config("aot_gpt_base").ffn_kinds() == ["none"] * 24
    assert get_config("crate_b").ffn_kinds() == ["ista"] * 12
