"""Every registered model builds at tiny size, runs forward + backward on CPU, and has its documented shape."""

import pytest
import torch
from models_helpers import example_input, expected_shape, tiny_overrides

import attnzoo
from attnzoo.models import create_model, get_config, list_models


@pytest.mark.parametrize("name", list_models())
def test_forward_backward_tiny(name):
    over = tiny_overrides(name)
    model = create_model(name, **over)
    cfg = model.config
    assert cfg.mechanisms() == get_config(name, **over).mechanisms()
    # same mechanisms as the full-size registered config
    assert set(cfg.mechanisms()) == set(get_config(name).mechanisms())
    model.train()
    inputs = example_input(cfg, batch=2)
    out = model(*inputs)
    assert out.shape == expected_shape(cfg, 2)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: parameter {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: parameter {pname} has a non-finite gradient"
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", ["tost_t", "gpt2_base", "tost_lra_listops", "icl_gpt"])
def test_shorter_inputs(name):
    """Sequence models accept any length up to their maximum (vision models need their image size)."""
    model = create_model(name, **tiny_overrides(name)).eval()
    cfg = model.config
    if cfg.arch == "vision":
        with pytest.raises(ValueError, match="images must have shape"):
            model(torch.randn(1, 3, cfg.image_size + 2, cfg.image_size + 2))
        return
    for n in (1, 3):
        out = model(*example_input(cfg, batch=1, n=n))
        assert out.shape == expected_shape(cfg, 1, n)


def test_top_level_exports():
    assert attnzoo.create_model is create_model
    assert attnzoo.list_models() == list_models()
    from attnzoo.models import from_pretrained

    assert attnzoo.from_pretrained is from_pretrained


def test_list_models_pattern():
    names = list_models("tost_*")
    assert names and all(n.startswith("tost_") for n in names)
    for required in [
        "tost_t",
        "tost_s",
        "tost_m",
        "xcit_s",
        "xcit_m",
        "vit_s",
        "vit_b",
        "crate_t",
        "crate_s",
        "crate_b",
        "crate_l",
        "cbt_t",
        "cbt_s",
        "cbt_b",
        "cbt_l",
        "aot_vision_b",
        "aot_vision_l",
        "aot_vision_h",
        "csp_vit_cifar",
        "tost_gpt_base",
        "tost_gpt_medium",
        "tost_gpt_large",
        "aot_gpt_base",
        "aot_gpt_medium",
        "aot_gpt_large",
        "gpt2_base",
    ]:
        assert required in list_models()


BIDIRECTIONAL_MODELS = ["tost_s", "crate_t", "tost_lra_text"]
CAUSAL_MODELS = ["gpt2_base", "icl_aot"]


@pytest.mark.parametrize("name", BIDIRECTIONAL_MODELS + CAUSAL_MODELS)
def test_any_valid_mechanism_drops_into_any_architecture(name):
    causal = name in CAUSAL_MODELS
    mechs = attnzoo.list_attentions(causal=True if causal else False)
    assert len(mechs) >= (4 if causal else 6)
    for mech in mechs:
        model = create_model(name, attention=mech, **tiny_overrides(name))
        assert all(type(b.attn).registry_name == mech for b in model.blocks)
        assert all(b.attn.causal == causal for b in model.blocks)
        cfg = model.config
        out = model(*example_input(cfg, batch=2))
        assert out.shape == expected_shape(cfg, 2)
        assert torch.isfinite(out).all()
