"""The CRATE+CBT hybrid (CBSA §4.1, Tables 5/6): MSSA in the first half of the blocks, CBSA in the second."""

import pytest
import torch

import attnzoo
from attnzoo.models import get_config
from attnzoo.train.config import load_config


@pytest.mark.parametrize("name, depth", [("crate_cbt_t", 12), ("crate_cbt_s", 12)])
def test_papers_sizes_build_with_mssa_then_cbsa(name, depth):
    model = attnzoo.create_model(name, device="meta")
    kinds = [type(b.attn).registry_name for b in model.blocks]
    assert kinds == ["mssa"] * (depth // 2) + ["cbsa"] * (depth // 2)
    assert {type(b.ffn).__name__ for b in model.blocks} == {"ISTA"}  # CRATE's ISTA step after both mechanisms
    cfg = get_config(name)
    assert cfg.pool == "cls" and cfg.patch_embed == "conv"


def test_scenes_configuration_trains_a_step():
    cfg = load_config("scenes_crate_cbt_small")
    torch.manual_seed(0)
    model = attnzoo.create_model(cfg.model, image_size=64, in_chans=1, num_classes=10, **cfg.resolved_model_options())
    kinds = [type(b.attn).registry_name for b in model.blocks]
    assert kinds == ["mssa"] * 3 + ["cbsa"] * 3
    assert model.blocks[3].attn.rep_grid == (4, 4) and model.blocks[3].attn.grid == (8, 8)
    x = torch.randn(2, 1, 64, 64)
    logits = model(x)
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, torch.tensor([1, 7])).backward()
    for block in (model.blocks[0], model.blocks[-1]):  # both mechanisms receive gradients
        grads = [p.grad for p in block.attn.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
