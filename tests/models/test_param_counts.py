"""Parameter counts of the papers' configurations, computed on the meta device (nothing is allocated)."""

import json

import pytest
import torch
from torch import nn

from attnzoo.models import (
    count_parameters,
    create_model,
    from_pretrained,
    get_config,
    list_models,
    model_entry,
    paper_comparable_count,
)

WITH_FIGURES = [n for n in list_models() if model_entry(n).paper_params is not None]
MATCHED = [n for n in WITH_FIGURES if "known-gap" not in model_entry(n).tags]


def test_every_paper_table_is_covered():
    """The figures of ToST Tables 2/4/5/6, CBSA Table 3, AoT Tables 1/2 and CSP Table 3 are all registered."""
    expected = {
        "tost_t",
        "tost_s",
        "tost_m",
        "xcit_s",
        "xcit_m",
        "vit_s",
        "vit_b",  # ToST Tables 2/5
        "tost_gpt_base",
        "tost_gpt_medium",
        "tost_gpt_large",
        "gpt2_base",  # ToST Tables 4/6
        "cbt_t",
        "cbt_s",
        "cbt_b",
        "cbt_l",
        "crate_b",
        "crate_l",  # CBSA Table 3
        "aot_gpt_base",
        "aot_gpt_medium",
        "aot_gpt_large",
        "aot_gpt_hybrid",
        "aot_gpt_full_mlp",  # AoT Table 1
        "aot_vision_b",
        "aot_vision_l",
        "aot_vision_h",  # AoT Table 2
        "csp_vit_cifar",
        "vit_cifar",  # CSP Table 3
    }
    assert expected <= set(WITH_FIGURES)


@pytest.mark.parametrize("name", MATCHED)
def test_count_within_5_percent_of_paper(name):
    entry = model_entry(name)
    count = paper_comparable_count(name)
    figure = entry.paper_params * entry.paper_params_unit
    assert abs(count - figure) / figure < 0.05, f"{name}: {count} parameters vs paper {figure:.0f}"


def test_aot_huge_needs_crate_dim_head():
    """AoT-Huge (86M) uses 16 subspaces of 64 at width 1280; dim // heads = 80 would give 107.4M."""
    assert abs(count_parameters("aot_vision_h") - 86e6) / 86e6 < 0.01
    d, depth, inner = 1280, 32, 16 * 64
    grow = depth * 2 * d * (d - inner)  # qkv and to_out at the full 1280 inner width
    wide = count_parameters("aot_vision_h", attention_options={})
    assert wide - count_parameters("aot_vision_h") == grow


def test_exact_counts_from_formulas():
    # GPT-2 124M as printed by every reference implementation (vocab 50257, 1024 positions)
    assert count_parameters("gpt2_base") == 124_439_808
    # ToST-Base: GPT-2 minus 2 d^2 + 3d per layer (one dim->dim U without bias instead of qkv),
    # plus TSSA's temperature (heads) and causal position bias (heads x 1024)
    d, L, h = 768, 12, 12
    assert count_parameters("tost_gpt_base") == 124_439_808 - L * (2 * d * d + 3 * d) + L * (h + h * 1024)
    # CSP removes exactly the query and key projections (2 dim^2 per layer) from the CIFAR ViT
    mha = count_parameters("csp_vit_cifar", attention="softmax", attention_options={"qkv_bias": False})
    assert mha - count_parameters("csp_vit_cifar") == 6 * 2 * 512 * 512


def test_csp_table3_mha_vs_csp():
    """CSP Table 3, CIFAR-10: 9.52M with MHA, 6.38M with CSP, for the same ViT."""
    mha = count_parameters("csp_vit_cifar", attention="softmax")
    csp = count_parameters("csp_vit_cifar")
    assert abs(mha - 9.52e6) / 9.52e6 < 0.05
    assert abs(csp - 6.38e6) / 6.38e6 < 0.05
    assert mha == count_parameters("vit_cifar")


def test_hybrids_count_between_their_parents():
    # CRATE+CBT differs from CBT only in the first half's attention (MSSA has no step sizes)
    cbt, hybrid = count_parameters("cbt_s"), count_parameters("crate_cbt_s")
    assert cbt - hybrid == 6 * 2 * 6  # 6 MSSA layers x (kappa + eta) x 6 heads
    base = count_parameters("aot_gpt_full_mlp")
    d = 768
    assert base - count_parameters("aot_gpt_hybrid") == 6 * (8 * d * d + 5 * d + 2 * d)  # 6 MLPs + their LayerNorms


def test_meta_device_allocates_nothing():
    model = create_model("tost_gpt_large", device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == count_parameters("tost_gpt_large")


def test_tied_embeddings_counted_once():
    model = create_model("gpt2_base", device="meta")
    assert model.lm_head.weight is model.wte.weight
    untied = count_parameters("gpt2_base", tie_weights=False)
    assert untied - count_parameters("gpt2_base") == 50257 * 768


def test_count_excludes_position_embeddings_for_aot():
    full = count_parameters("aot_gpt_base")
    assert paper_comparable_count("aot_gpt_base") == full - 1024 * 1024
    assert get_config("aot_gpt_base").block_size == 1024


TOST_FAMILY = ["tost_t", "tost_s", "tost_m"] + [n for n in list_models() if n.startswith("tost_lra_")]


def _layernorm_eps(model: nn.Module) -> set[float]:
    return {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}


@pytest.mark.parametrize("name", TOST_FAMILY)
def test_tost_configs_follow_the_authors_code(name):
    """tost_vision/tost.py builds every ToST model with qkv_bias=True and LayerNorm(eps=1e-6)."""
    model = create_model(name, device="meta")
    assert _layernorm_eps(model) == {1e-6}
    assert all(blk.attn.qkv.bias is not None for blk in model.blocks)
    cfg = get_config(name)
    # the bias is the only parameter it adds: dim per TSSA layer
    no_bias = count_parameters(name, attention_options={**cfg.attention_options, "qkv_bias": False})
    assert count_parameters(name) - no_bias == cfg.depth * cfg.dim


def test_xcit_baselines_share_the_tost_skeleton_eps():
    # the same code builds XCiT with the same norm layer; XCA's qkv has its bias already
    for name in ("xcit_s", "xcit_m"):
        model = create_model(name, device="meta")
        assert _layernorm_eps(model) == {1e-6}
        assert all(blk.attn.qkv.bias is not None for blk in model.blocks)


@pytest.mark.parametrize(
    "name", ["vit_s", "crate_b", "cbt_s", "gpt2_base", "aot_gpt_base", "csp_vit_cifar", "csp_lra_text", "tost_gpt_base"]
)
def test_other_families_keep_pytorch_layernorm_eps(name):
    # tost_gpt_*: the authors' language code is nanoGPT's (LayerNorm eps 1e-5, no qkv bias), so it stays
    assert _layernorm_eps(create_model(name, device="meta")) == {1e-5}
    assert get_config(name).norm_eps == 1e-5


def test_norm_eps_validated():
    with pytest.raises(ValueError, match="norm_eps must be a positive finite number"):
        get_config("vit_s", norm_eps=0.0)
    with pytest.raises(ValueError, match="norm_eps must be a positive finite number"):
        get_config("vit_s", norm_eps=float("nan"))


def test_checkpoint_without_norm_eps_loads_as_before(tmp_path):
    """A config.json written before norm_eps existed loads with PyTorch's 1e-5 and the same outputs."""
    torch.manual_seed(0)
    model = create_model("vit_s", image_size=32, patch_size=8, dim=32, depth=2, heads=2, num_classes=3).eval()
    model.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    d = json.loads(cfg_path.read_text())
    del d["norm_eps"]
    cfg_path.write_text(json.dumps(d))
    loaded = from_pretrained(tmp_path).eval()
    assert loaded.config.norm_eps == 1e-5 and _layernorm_eps(loaded) == {1e-5}
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
