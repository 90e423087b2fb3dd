"""Segmentation decoders (CBSA Fig. 8): shapes and layouts, mIoU by hand, fitting, FLOPs, the noise sweep."""

import json

import numpy as np
import pytest
import torch

from attnzoo.analysis.segment_decoders import (
    build_segmenter,
    confusion_matrix,
    decoder_flops,
    evaluate_miou,
    fit_segmenter,
    mean_iou,
    perturb_attention,
    perturbation_sweep,
)
from attnzoo.data import build_task
from attnzoo.layers.base import Attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = dict(num_classes=11, image_size=32, patch_size=8, dim=32, depth=1, heads=4, decoder_depth=1)


@pytest.fixture(scope="module")
def scenes():
    return build_task("scenes", n_train=64, n_val=8, img_size=32)


@pytest.mark.parametrize("decoder, mechanism, ffn", [("cbsa", "cbsa", None), ("mask_transformer", "softmax", "Mlp")])
def test_decoders_give_pixel_logits(decoder, mechanism, ffn):
    model = build_segmenter("vit_s", decoder, **TINY)
    block = model.decoder.blocks[0]
    assert type(block.attn).registry_name == mechanism
    assert (type(block.ffn).__name__ if block.ffn is not None else None) == ffn
    if decoder == "cbsa":  # the class embeddings lead, the patches are pooled on their grid
        assert block.attn.num_prefix_tokens == 11 and block.attn.grid == (4, 4)
    logits = model(torch.randn(2, 1, 32, 32))
    assert logits.shape == (2, 11, 32, 32) and torch.isfinite(logits).all()


def test_bad_decoder_options_name_the_value():
    with pytest.raises(ValueError, match="'unet'"):
        build_segmenter("vit_s", "unet", **TINY)
    with pytest.raises(ValueError, match="num_classes=1"):
        build_segmenter("vit_s", "cbsa", **{**TINY, "num_classes": 1})


def test_miou_by_hand():
    target = torch.tensor([[0, 0, 1, 1], [0, 0, 2, 2]])
    pred = torch.tensor([[0, 1, 1, 1], [0, 0, 2, 0]])
    conf = confusion_matrix(pred, target, 4)
    assert conf.sum() == 8 and conf[0, 0] == 3 and conf[0, 1] == 1 and conf[2, 0] == 1
    # class 0: 3 / (3 + 1 + 1) ; class 1: 2 / 3 ; class 2: 1 / 2 ; class 3 absent everywhere: not counted
    assert mean_iou(conf) == pytest.approx((3 / 5 + 2 / 3 + 1 / 2) / 3)
    assert mean_iou(confusion_matrix(target, target, 4)) == 1.0


def test_fit_lowers_the_loss_and_the_sweep_is_exact_at_zero(scenes):
    torch.manual_seed(0)
    model = build_segmenter("vit_s", "cbsa", **TINY)
    losses = fit_segmenter(model, scenes.train, steps=12, batch_size=8, lr=3e-3)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    base = evaluate_miou(model, scenes.val, images=8)
    sweep = perturbation_sweep(model, scenes.val, [0.0, 0.5], draws=2, images=8)
    assert sweep["miou"][0] == [base, base]  # no noise: the model's own mIoU, every draw
    assert all(0.0 <= v <= 1.0 for v in sweep["miou"][1])


def test_noise_reaches_the_decoders_attention_only():
    model = build_segmenter("vit_s", "mask_transformer", **TINY)
    noisy = perturb_attention(model, 0.1, torch.Generator().manual_seed(0))
    attn = {n for n, m in noisy.named_modules() if isinstance(m, Attention) and n.startswith("decoder.")}
    before, after = dict(model.named_parameters()), dict(noisy.named_parameters())
    for name, p in after.items():
        changed = not torch.equal(p, before[name])
        assert changed == any(name.startswith(a + ".") for a in attn), name
    assert attn  # the decoder has attention layers to perturb


def test_decoder_flops_count_the_decoder_only():
    cbsa = decoder_flops(build_segmenter("vit_s", "cbsa", **TINY), 32)
    softmax = decoder_flops(build_segmenter("vit_s", "mask_transformer", **TINY), 32)
    assert 0 < cbsa < softmax  # no feed-forward part in the CBSA decoder
    deeper_encoder = decoder_flops(build_segmenter("vit_s", "cbsa", **{**TINY, "depth": 3}), 32)
    deeper_decoder = decoder_flops(build_segmenter("vit_s", "cbsa", **{**TINY, "decoder_depth": 2}), 32)
    assert deeper_encoder == cbsa and deeper_decoder > cbsa


def test_analyze_segment_decoders_writes_both_decoders(tmp_path, capsys):
    from attnzoo.analysis import cli as analyze_cli

    out = tmp_path / "dec"
    args = ["segment-decoders", "--out", str(out), "--n-train", "16", "--images", "4", "--steps", "2"]
    args += ["--batch-size", "4", "--dim", "32", "--depth", "1", "--decoder-depth", "1", "--sigmas", "0,0.1"]
    args += ["--draws", "1"]
    assert analyze_cli.main(args) == 0
    result = json.loads((out / "segment-decoders.json").read_text())
    rows = result["decoders"]
    assert set(rows) == {"cbsa", "mask_transformer"}
    assert rows["cbsa"]["decoder_flops"] < rows["mask_transformer"]["decoder_flops"]
    assert rows["cbsa"]["sweep"]["miou"][0] == [rows["cbsa"]["miou"]]  # sigma 0: the fitted model itself
    assert (out / "segment-decoders.png").stat().st_size > 0
    assert "MFLOPs" in capsys.readouterr().out
    assert analyze_cli.main([*args[:3], "--sigmas", "0,x"]) == 2
    assert "--sigmas" in capsys.readouterr().err
