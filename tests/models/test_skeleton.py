"""The shared skeleton: block layouts, ISTA, LayerScale, context options, embeddings, class attention, heads."""

import math

import pytest
import torch
import torch.nn.functional as F
from models_helpers import tiny_overrides

from attnzoo import build_attention, capture_internals
from attnzoo.models import ISTA, Block, ClassAttentionBlock, create_model, get_config
from attnzoo.models.embeddings import ConvStem, FourierPositionalEncoding, LinearLNPatchEmbed, sinusoidal_positions


def _block(norm, ffn, **kw):
    mixer = build_attention("softmax", 16, 2)
    return Block(16, mixer, ffn=ffn, hidden=24, norm=norm, **kw).double().eval()


def test_pre_norm_layout():
    b = _block("pre", "mlp")
    x = torch.randn(2, 5, 16, dtype=torch.double)
    h = x + b.attn(b.norm1(x))
    torch.testing.assert_close(b(x), h + b.ffn(b.norm2(h)))


def test_post_norm_layout():
    b = _block("post", "mlp")
    x = torch.randn(2, 5, 16, dtype=torch.double)
    h = b.norm1(x + b.attn(x))
    torch.testing.assert_close(b(x), b.norm2(h + b.ffn(h)))


def test_no_norm_attention_only_layout():
    b = _block("none", "none")
    x = torch.randn(2, 5, 16, dtype=torch.double)
    torch.testing.assert_close(b(x), x + b.attn(x))
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in b.modules())


def test_crate_layout_ista_without_residual():
    """CRATE: Z <- ISTA(LN(Z + MSSA(LN(Z))))."""
    b = _block("pre", "ista")
    x = torch.randn(2, 5, 16, dtype=torch.double)
    torch.testing.assert_close(b(x), b.ffn(b.norm2(x + b.attn(b.norm1(x)))))


def test_residual_off_and_layerscale():
    b = _block("pre", "mlp", residual=False, layerscale=0.5)
    x = torch.randn(2, 5, 16, dtype=torch.double)
    h = 0.5 * b.attn(b.norm1(x))
    torch.testing.assert_close(b(x), 0.5 * b.ffn(b.norm2(h)))
    assert torch.equal(b.ls1.gamma, torch.full((16,), 0.5, dtype=torch.double))


def test_ista_is_a_proximal_sparse_coding_step():
    ista = ISTA(8, step=0.1, lambd=0.1).double()
    z = torch.randn(3, 8, dtype=torch.double)
    d = ista.weight
    # row-vector form of ReLU(z + eta D^T (z - D z) - eta lambda), D acting as z -> D z = z @ D^T
    expected = F.relu(z + 0.1 * (z - z @ d.T) @ d - 0.1 * 0.1)
    torch.testing.assert_close(ista(z), expected)
    # a fixed point when D is orthogonal and the code is large and positive: only the lambda shrink remains
    with torch.no_grad():
        ista.weight.copy_(torch.eye(8, dtype=torch.double))
    z = torch.rand(3, 8, dtype=torch.double) + 1.0
    torch.testing.assert_close(ista(z), z - 0.01)


def test_context_options_reach_the_mechanisms():
    over = tiny_overrides("csp_vit_cifar")
    model = create_model("csp_vit_cifar", **over)
    assert [b.attn.layer_index for b in model.blocks] == list(range(over["depth"]))
    assert all(b.attn.num_layers == over["depth"] for b in model.blocks)
    cbt = create_model("cbt_t", **tiny_overrides("cbt_t"))
    assert cbt.blocks[0].attn.grid == (8, 8) and cbt.blocks[0].attn.num_prefix_tokens == 1
    lm = create_model("tost_gpt_base", **tiny_overrides("tost_gpt_base"))
    assert lm.blocks[0].attn.bias.shape == (4, 16, 1)  # TSSA's causal bias covers block_size positions
    # explicit options win over the context
    over = tiny_overrides("csp_vit_cifar", attention_options={"groups": 8, "layer_index": 0})
    model = create_model("csp_vit_cifar", **over)
    assert all(b.attn.layer_index == 0 for b in model.blocks)


def test_hybrid_blocks_use_each_mechanism_with_its_options():
    over = tiny_overrides("crate_cbt_t", depth=4, second_attention_options={"rep_grid": (2, 2)})
    model = create_model("crate_cbt_t", **over)
    names = [type(b.attn).registry_name for b in model.blocks]
    assert names == ["mssa", "mssa", "cbsa", "cbsa"]
    assert model.blocks[2].attn.rep_grid == (2, 2)


def test_capture_internals_names_blocks():
    model = create_model("tost_t", **tiny_overrides("tost_t")).eval()
    with capture_internals(model) as store:
        model(torch.randn(1, 3, 16, 16))
    assert "blocks.0.attn" in store and "blocks.1.attn" in store
    assert all(len(v) > 0 for k, v in store.items() if k.startswith("blocks."))
    # the class-attention layers record the [CLS] -> token maps (ToST Fig. 5)
    cls_map = store["cls_blocks.0.attn"]["attn"]
    assert cls_map.shape == (1, 4, 1, 65)
    torch.testing.assert_close(cls_map.sum(-1), torch.ones(1, 4, 1))


def test_fourier_positional_encoding():
    pe = FourierPositionalEncoding(24).double()
    f = pe.features((3, 4), dtype=torch.double)
    assert f.shape == (12, 64)
    # row-major: tokens in the same row share the y half, same column share the x half
    torch.testing.assert_close(f[0, :32], f[3, :32])
    torch.testing.assert_close(f[0, 32:], f[4, 32:])
    assert not torch.allclose(f[0], f[1])
    # interleaved sin/cos of the normalised coordinate (last row/col at 2*pi)
    assert torch.allclose(f[-1, 0], torch.tensor(math.sin(2 * math.pi), dtype=torch.double), atol=1e-12)
    assert torch.allclose(f[-1, 1], torch.tensor(1.0, dtype=torch.double))
    assert pe((3, 4)).shape == (1, 12, 24)
    assert sum(p.numel() for p in pe.parameters()) == 64 * 24 + 24


def test_conv_stem_matches_xcit_widths():
    stem = ConvStem(16, 3, 384)
    convs = [m for m in stem.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [48, 96, 192, 384]
    assert all(c.stride == (2, 2) and c.bias is None for c in convs)
    assert stem(torch.randn(1, 3, 32, 32)).shape == (1, 4, 384)
    with pytest.raises(ValueError, match="divisible by 8"):
        ConvStem(16, 3, 20)
    with pytest.raises(ValueError, match="power-of-two"):
        ConvStem(6, 3, 24)


def test_linear_ln_patch_embed_order():
    """Patches are row-major, each flattened as (p1, p2, channel) like CRATE/vit-pytorch."""
    emb = LinearLNPatchEmbed(2, 3, 8).double()
    x = torch.randn(1, 3, 4, 4, dtype=torch.double)
    vecs = []
    for i in range(2):
        for j in range(2):
            pix = [x[0, c, 2 * i + p1, 2 * j + p2] for p1 in range(2) for p2 in range(2) for c in range(3)]
            vecs.append(torch.stack(pix))
    manual = emb.norm_out(emb.proj(emb.norm_in(torch.stack(vecs)[None])))
    torch.testing.assert_close(emb(x), manual)


def test_linear_ln_patch_embed_refuses_one_value_patches():
    # LayerNorm over one value is identically 0: a 1-channel, 1-pixel patch would erase the image
    match = r"in_chans \* patch_size\*\*2 >= 2, got 1 \* 1\*\*2 = 1; use patch_embed='linear'"
    with pytest.raises(ValueError, match=match):
        LinearLNPatchEmbed(1, 1, 8)
    assert LinearLNPatchEmbed(1, 2, 8)(torch.randn(1, 2, 3, 3)).std() > 0


def test_sinusoidal_positions():
    p = sinusoidal_positions(5, 7)
    assert p.shape == (5, 7)
    torch.testing.assert_close(p[0], torch.tensor([0, 1, 0, 1, 0, 1, 0], dtype=torch.float))
    assert torch.allclose(p[3, 0], torch.tensor(math.sin(3.0)))


def test_class_attention_block_updates_only_cls():
    blk = ClassAttentionBlock(16, 2, mlp_hidden=32).double()
    x = torch.randn(2, 6, 16, dtype=torch.double)
    y = blk(x)
    assert torch.equal(y[:, 1:], x[:, 1:])
    x2 = x.clone()
    x2[:, 3] += torch.randn(2, 16, dtype=torch.double)  # a patch token (not a constant shift: LayerNorm hides it)
    assert not torch.allclose(blk(x2)[:, 0], y[:, 0])


@pytest.mark.parametrize("name,tokens", [("vit_s", 65), ("tost_t", 65), ("csp_vit_cifar", 64), ("crate_t", 65)])
def test_vision_token_layouts(name, tokens):
    model = create_model(name, **tiny_overrides(name)).eval()
    t = model.forward_tokens(torch.randn(2, 3, 16, 16))
    assert t.shape == (2, tokens, 32)
    assert model.forward_features(torch.randn(2, 3, 16, 16)).shape == (2, 32)


def test_class_attention_model_blocks_see_only_patches():
    """XCiT/ToST: the CLS token joins after the blocks (only the class-attention layers see it)."""
    model = create_model("tost_t", **tiny_overrides("tost_t")).eval()
    seen = []
    model.blocks[0].register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    model(torch.randn(1, 3, 16, 16))
    assert seen == [64]


def test_feature_extractor_without_head():
    model = create_model("vit_s", **tiny_overrides("vit_s", num_classes=0)).eval()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 32)


def test_dual_sequence_classifier():
    name = "tost_lra_retrieval"
    model = create_model(name, **tiny_overrides(name)).double().eval()
    a = torch.randint(0, 20, (2, 10))
    b = torch.randint(0, 20, (2, 7))
    out = model(a, b)
    assert out.shape == (2, 2)
    u, v = model.encode(a), model.encode(b)
    torch.testing.assert_close(out, model.head(torch.cat([u, v, u * v, u - v], -1)))
    with pytest.raises(ValueError, match="two-sequence"):
        model(a)
    single = create_model("tost_lra_text", **tiny_overrides("tost_lra_text"))
    with pytest.raises(ValueError, match="takes one sequence"):
        single(a, b)


def test_sequence_classifier_pooling_and_head():
    model = create_model("csp_lra_text", **tiny_overrides("csp_lra_text", head_dim=16)).eval()
    assert model.cls_token is not None and model.blocks[0].attn.groups == 1
    assert isinstance(model.head, torch.nn.Sequential)
    assert model(torch.randint(0, 20, (3, 24))).shape == (3, 2)
    assert get_config("tost_lra_pathfinder").norm == "post"
