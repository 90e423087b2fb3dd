"""Capture and the model experiments (layerwise, membership, attention-maps, subspaces) end to end on
tiny models: registry models from ``attnzoo.create_model`` and a stack assembled from ``build_attention``."""

import json

import pytest
import torch
from torch import nn

import attnzoo
from attnzoo.analysis import (
    attention_maps,
    capture_layers,
    layer_measures,
    layerwise,
    measures,
    membership,
    subspace_bases,
    subspaces,
    token_grid,
)
from attnzoo.analysis.cli import main as analyze_main

TINY = dict(image_size=16, patch_size=4, depth=2, dim=16, heads=2, num_classes=3)


def tiny(name, **kw):
    return attnzoo.create_model(name, **{**TINY, **kw}).eval()


class Stack(nn.Module):
    """Pre-norm residual blocks around ``build_attention`` modules, on ready tokens (B, N, dim)."""

    def __init__(self, mechanism, dim=8, heads=2, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm": nn.LayerNorm(dim), "attn": attnzoo.build_attention(mechanism, dim, heads)})
            for _ in range(depth)
        )

    def forward(self, x):
        for b in self.blocks:
            x = x + b["attn"](b["norm"](x))
        return x


def test_capture_layers_on_assembled_stack_is_side_effect_free():
    torch.manual_seed(0)
    model = Stack("tssa").eval()
    x = torch.randn(2, 9, 8)
    ref = model(x)
    out, layers = capture_layers(model, x)
    torch.testing.assert_close(out, ref)
    assert [lay.name for lay in layers] == ["blocks.0.attn", "blocks.1.attn"]
    assert all(lay.mechanism == "tssa" for lay in layers)
    torch.testing.assert_close(layers[0].input, model.blocks[0]["norm"](x))
    torch.testing.assert_close(layers[0].output, model.blocks[0]["attn"](model.blocks[0]["norm"](x)))
    assert layers[0].internals["pi"].shape == (2, 2, 9)
    assert not any(m._forward_hooks for m in model.modules())  # hooks removed
    assert all(not m.capturing for m in model.modules() if isinstance(m, attnzoo.Attention))
    # TSSA's U_k are the rows of its qkv projection, head-major
    u = subspace_bases(model.blocks[1]["attn"])
    w = model.blocks[1]["attn"].qkv.weight
    torch.testing.assert_close(u[1], w[4:8].T.detach())
    meas = layer_measures(layers[1])
    pi = layers[1].internals["pi"].transpose(-1, -2)
    expected = measures.variational_compression(layers[1].input.double(), pi, u).mean().item()
    assert meas["variational_compression"] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="no attnzoo Attention modules"):
        capture_layers(nn.Linear(3, 3), torch.randn(1, 3))


def test_membership_on_assembled_stack_with_explicit_grid():
    torch.manual_seed(1)
    model = Stack("tssa").eval()
    x = torch.randn(1, 1 + 12, 8)  # a leading [CLS] and a 3x4 grid
    r = membership(model, x, grid=(3, 4))
    maps = torch.tensor(r["membership"]["blocks.0.attn"])
    assert maps.shape == (2, 3, 4)
    torch.testing.assert_close(maps.sum(0), torch.ones(3, 4))  # Π rows are distributions over subspaces
    _, layers = capture_layers(model, x)
    torch.testing.assert_close(maps[1], layers[0].internals["pi"][0, 1, 1:].reshape(3, 4))


def test_layerwise_tost_and_cbt_report_their_compression_terms():
    x = torch.randn(2, 3, 16, 16)
    r = layerwise(tiny("tost_t"), x)
    assert [row["mechanism"] for row in r["layers"]] == ["tssa", "tssa"]
    for key in ("coding_rate", "compression", "variational_compression", "variational_compression_normalized"):
        assert len(r["series"][key]) == 2 and all(v > 0 for v in r["series"][key])
    r = layerwise(tiny("cbt_t"), x)
    assert "compression" in r["series"] and "variational_compression" not in r["series"]
    r = layerwise(tiny("vit_cifar"), x)  # black-box: coding rate only
    assert set(r["series"]) == {"coding_rate", "coding_rate_normalized"}


def test_layerwise_crate_measure_on_tokens_entering_and_leaving_each_block():
    torch.manual_seed(3)
    model = tiny("crate_t", depth=3)
    x = torch.randn(2, 3, 16, 16)
    r = layerwise(model, x, crate_eps=0.1)
    assert r["params"] == {"eps": 0.5, "crate_eps": 0.1}
    _, layers = capture_layers(model, x)
    for lay, row in zip(layers, r["layers"], strict=True):
        u = subspace_bases(lay.module)
        assert row["crate_compression"] == pytest.approx(
            measures.crate_compression_term(lay.input.double(), u, 0.1).mean().item(), rel=1e-12
        )
        # leaving: the block's output (the residual stream after MSSA and ISTA), measured with the same U^ℓ
        assert lay.block_output is not None and not torch.equal(lay.block_output, lay.input)
        assert row["crate_compression_out"] == pytest.approx(
            measures.crate_compression_term(lay.block_output.double(), u, 0.1).mean().item(), rel=1e-12
        )
    # the next layer's input is the previous block's output through that layer's pre-norm
    with torch.no_grad():
        torch.testing.assert_close(layers[1].input, model.blocks[1].norm1(layers[0].block_output))
    # a black-box layer has no bases: no CRATE measure
    assert "crate_compression" not in layerwise(tiny("vit_cifar"), x)["series"]


def test_layerwise_tost_measures_its_outputs_with_their_own_memberships():
    torch.manual_seed(4)
    model = tiny("tost_t")
    x = torch.randn(2, 3, 16, 16)
    r = layerwise(model, x)
    _, layers = capture_layers(model, x)
    lay, row = layers[0], r["layers"][0]
    zo = lay.block_output
    # ToST Fig. 4a: Π^ℓ = Π(Z^ℓ | U^ℓ) of the outputs, i.e. what the layer's TSSA assigns when fed those tokens
    from einops import rearrange

    from attnzoo.ops.tssa import tssa_pi

    mod = lay.module
    with torch.no_grad():
        w = rearrange(mod.qkv(zo), "b n (h p) -> b h n p", h=mod.heads)
        pi_out = tssa_pi(w, mod.temp.view(-1), causal=False, bias=mod.bias).transpose(-1, -2)
    assert not torch.allclose(pi_out, lay.internals["pi"].transpose(-1, -2))  # not the input's memberships
    expected = measures.variational_compression(zo.double(), pi_out, subspace_bases(mod)).mean().item()
    assert row["variational_compression_out"] == pytest.approx(expected, rel=1e-6)
    assert all(not m.capturing for m in model.modules() if isinstance(m, attnzoo.Attention))


def test_membership_and_class_attention_maps_of_tost():
    model = tiny("tost_t")
    x = torch.randn(2, 3, 16, 16)
    r = membership(model, x, image=1)
    assert list(r["membership"]) == ["blocks.0.attn", "blocks.1.attn"]
    maps = torch.tensor(r["membership"]["blocks.1.attn"])
    assert maps.shape == (2, 4, 4)
    torch.testing.assert_close(maps.sum(0), torch.ones(4, 4))
    r = attention_maps({"tost": model}, x)
    assert r["layers"]["tost"]["cls_layer"] == "cls_blocks.0.attn"  # penultimate class-attention layer
    cls = torch.tensor(r["cls_maps"]["tost"])
    assert cls.shape == (2, 4, 4) and (cls >= 0).all() and (cls.sum((1, 2)) <= 1 + 1e-6).all()
    assert not any(getattr(m, "capturing", False) for m in model.modules())  # capture switched off again
    with pytest.raises(ValueError, match="no layer recorded memberships"):
        membership(tiny("vit_cifar"), x)


def test_softmax_vs_fastmax_attention_matrices_side_by_side():
    x = torch.randn(1, 3, 16, 16)
    models = {"softmax": tiny("vit_cifar"), "fastmax": tiny("vit_cifar", attention="fastmax")}
    r = attention_maps(models, x, layer=0)
    for label in models:
        a = torch.tensor(r["matrices"][label])
        assert a.shape == (2, 16, 16)
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 16), atol=1e-5, rtol=0)
        assert r["layers"][label]["matrix_layer"] == "blocks.0.attn"
    assert r["cls_maps"] == {}  # mean pooling: no [CLS]


def test_subspaces_gram_of_white_box_layers():
    r = subspaces(tiny("tost_t"), directions=3)
    g = torch.tensor(r["gram"]["blocks.0.attn"])
    assert g.shape == (6, 6)
    torch.testing.assert_close(g.diagonal(), torch.ones(6), atol=1e-6, rtol=0)
    assert 0 < r["coherence"]["blocks.0.attn"]["mean_abs_cross"] < 1
    with pytest.raises(ValueError, match="no white-box layers"):
        subspaces(tiny("vit_cifar"))


def test_token_grid():
    assert token_grid(16) == (0, (4, 4))
    assert token_grid(17) == (1, (4, 4))
    assert token_grid(13, (3, 4)) == (1, (3, 4))
    with pytest.raises(ValueError, match="cannot lay 7 tokens"):
        token_grid(7)


def test_cli_model_experiments_from_checkpoints(tmp_path):
    from attnzoo.models.checkpoint import save_pretrained

    save_pretrained(tiny("tost_t"), tmp_path / "tost")
    save_pretrained(tiny("vit_cifar"), tmp_path / "soft")
    save_pretrained(tiny("vit_cifar", attention="fastmax"), tmp_path / "fast")
    torch.save(torch.randn(3, 3, 16, 16), tmp_path / "batch.pt")
    common = ["--dpi", "40"]
    for exp in ("layerwise", "membership", "subspaces"):
        out = tmp_path / exp
        extra = [] if exp == "subspaces" else ["--data", str(tmp_path / "batch.pt"), "--batch", "2"]
        assert analyze_main([exp, "--out", str(out), "--checkpoint", str(tmp_path / "tost"), *extra, *common]) == 0
        assert json.loads((out / f"{exp}.json").read_text())["experiment"] == exp
        assert (out / f"{exp}.png").stat().st_size > 500
    out = tmp_path / "maps"
    assert (
        analyze_main(
            [
                "attention-maps",
                "--out",
                str(out),
                "--checkpoint",
                str(tmp_path / "soft"),
                "--checkpoint",
                str(tmp_path / "fast"),
                "--batch",
                "1",
                *common,
            ]
        )
        == 0
    )
    data = json.loads((out / "attention-maps.json").read_text())
    assert len(data["matrices"]) == 2
    # registry model with overrides instead of a checkpoint
    out = tmp_path / "lw"
    assert (
        analyze_main(
            [
                "layerwise",
                "--out",
                str(out),
                "--model",
                "cbt_t",
                *[a for k, v in TINY.items() for a in ("--model-opt", f"{k}={v}")],
                "--batch",
                "2",
                *common,
            ]
        )
        == 0
    )
    assert "compression" in json.loads((out / "layerwise.json").read_text())["series"]
