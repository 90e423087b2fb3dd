"""Zero-shot segmentation probes: thresholding, IoU by hand, a map equal to the mask scores 1, each mechanism's
[CLS] map, and ``attnzoo analyze segment RUN_DIR`` on a tiny trained run."""

import json

import numpy as np
import pytest
import torch

import attnzoo
from attnzoo.analysis import capture_layers
from attnzoo.analysis.segment import (
    cls_attention_maps,
    iou,
    segmentation_ious,
    threshold_mass,
    upsample_masks,
    zero_shot_segmentation,
)
from attnzoo.data import build_task

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_overrides(name: str, **extra) -> dict:
    """A 2-block, 32-wide, 4-head version of a registered vision model (a hybrid switches after block 1)."""
    over = dict(dim=32, heads=4, depth=2, num_classes=5, class_attention_layers=1)
    if attnzoo.models.get_config(name).second_attention is not None:
        over["second_attention_from"] = 1
    return {**over, **extra}


@pytest.fixture(scope="module")
def scenes():
    return build_task("scenes", n_train=8, n_val=8, img_size=32)


def test_threshold_keeps_the_top_mass():
    m = torch.tensor([[0.1, 0.5], [0.3, 0.1]])
    # ascending 0.1, 0.1, 0.3, 0.5: cumulative shares 0.1, 0.2, 0.5, 1.0; kept where > 0.4
    assert threshold_mass(m, 0.6).tolist() == [[False, True], [True, False]]
    assert threshold_mass(m, 0.45).tolist() == [[False, True], [False, False]]
    assert threshold_mass(m, 1.0).all()
    assert threshold_mass(torch.tensor([[-1.0, 2.0]]), 0.6).tolist() == [[False, True]]  # negatives count 0
    with pytest.raises(ValueError, match="mass=0"):
        threshold_mass(m, 0.0)


def test_iou_by_hand():
    pred = torch.zeros(4, 4, dtype=torch.bool)
    target = torch.zeros(4, 4, dtype=torch.bool)
    pred[0, 0:3] = True  # 3 pixels
    target[0, 2:4] = True  # 2 pixels, 1 shared
    assert float(iou(pred, target)) == pytest.approx(1 / 4)
    assert float(iou(pred, pred)) == 1.0 and float(iou(pred, ~pred)) == 0.0
    empty = torch.zeros(4, 4, dtype=torch.bool)
    assert float(iou(empty, empty)) == 1.0


def test_upsample_is_nearest_per_patch():
    m = torch.tensor([[True, False], [False, True]])
    up = upsample_masks(m, (4, 4))
    assert up.tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2


def test_a_map_equal_to_the_mask_scores_one(scenes):
    masks = scenes.val.masks(np.arange(4))
    fg = masks["foreground"]
    pred = upsample_masks(threshold_mass(fg.float().unsqueeze(1), 1.0), tuple(fg.shape[-2:]))
    ious = segmentation_ious(pred, masks, scenes.val.spec.boundary_width)
    for target, v in ious.items():
        torch.testing.assert_close(v, torch.ones(4, 1, dtype=torch.float64), msg=target)
    # its complement scores 0 on the foreground and the background, but keeps the same edges
    ious = segmentation_ious(~pred, masks, scenes.val.spec.boundary_width)
    assert ious["foreground"].max() == 0 and ious["background"].max() == 0
    torch.testing.assert_close(ious["boundary"], torch.ones(4, 1, dtype=torch.float64))


def test_boundary_iou_by_hand():
    fg = torch.zeros(1, 8, 8, dtype=torch.bool)
    fg[0, 2:6, 2:6] = True
    masks = {"foreground": fg, "background": ~fg, "boundary": torch.zeros_like(fg)}
    masks["boundary"][0, 1:7, 1:7] = True
    masks["boundary"][0, 3:5, 3:5] = False  # the band of width 2 around the 4x4 square: 32 pixels
    pred = torch.zeros(1, 1, 8, 8, dtype=torch.bool)
    pred[0, 0, 2:6, 2:5] = True  # a 4x3 box: its band (width 2) is rows 1-6 x cols 1-5 less the 2x1 inside
    ious = segmentation_ious(pred, masks, 2)
    assert float(ious["foreground"]) == pytest.approx(12 / 16)
    assert float(ious["background"]) == pytest.approx(48 / 52)
    # the box's band: rows 1-6 x cols 1-5 less its inside (3, 3), (4, 3): 28 pixels; of those, (3, 4) and (4, 4) lie
    # inside the square, off its band: 26 shared, 28 + 32 - 26 = 34 in the union
    band = torch.zeros(8, 8, dtype=torch.bool)
    band[1:7, 1:6] = True
    band[3:5, 3:4] = False
    inter = int((band & masks["boundary"][0]).sum())
    union = int((band | masks["boundary"][0]).sum())
    assert (int(band.sum()), inter, union) == (28, 26, 34)
    assert float(ious["boundary"]) == pytest.approx(26 / 34)


@pytest.mark.parametrize(
    "name, mechanisms, source",
    [
        ("vit_s", ["softmax", "softmax"], "[CLS] row of the attention"),
        ("crate_t", ["mssa", "mssa"], "[CLS] row of the attention"),
        ("cbt_t", ["cbsa", "cbsa"], "[CLS] row of A_k A_k^T (CBSA Fig. 7)"),
        ("tost_t", ["tssa", "tssa", "class_attention"], "TSSA memberships Pi (ToST eq 9)"),
    ],
)
def test_each_mechanism_gives_a_map_per_layer_and_head(name, mechanisms, source):
    model = attnzoo.create_model(name, **tiny_overrides(name, image_size=16, patch_size=4, in_chans=1)).eval()
    x = torch.randn(2, 1, 16, 16)
    found = cls_attention_maps(model, x)
    assert [f["mechanism"] for f in found] == mechanisms
    assert found[0]["source"] == source
    assert all(f["maps"].shape == (2, 4, 4, 4) for f in found)
    if name == "cbt_t":  # the [CLS] row of A_k A_kᵀ from the recorded A_kᵀ, over the 16 patches
        _, layers = capture_layers(model, x)
        ext = layers[0].internals["attn_extract"]
        torch.testing.assert_close(found[0]["maps"], (ext.transpose(-1, -2) @ ext)[:, :, 0, 1:].reshape(2, 4, 4, 4))
    if name in ("vit_s", "crate_t"):
        _, layers = capture_layers(model, x)
        torch.testing.assert_close(found[1]["maps"], layers[1].internals["attn"][:, :, 0, 1:].reshape(2, 4, 4, 4))


def test_zero_shot_segmentation_scores_layers_and_heads(scenes):
    model = attnzoo.create_model(
        "crate_cbt_t", **tiny_overrides("crate_cbt_t", image_size=32, patch_size=8, in_chans=1, num_classes=10)
    )
    result = zero_shot_segmentation(model, scenes.val, images=5, batch_size=2)
    assert [lay["mechanism"] for lay in result["layers"]] == ["mssa", "cbsa"]
    for lay in result["layers"]:
        assert set(lay["iou"]) == {"foreground", "background", "boundary"}
        assert all(len(v) == 4 and all(0.0 <= x <= 1.0 for x in v) for v in lay["iou"].values())
        assert lay["best"]["foreground"] == max(lay["iou"]["foreground"])
        assert all(len(v) == 4 and min(v) >= 0.0 for v in lay["iou_sem"].values())
    # batching does not change the scores
    again = zero_shot_segmentation(model, scenes.val, images=5, batch_size=5)
    for target, v in result["layers"][1]["iou"].items():
        assert again["layers"][1]["iou"][target] == pytest.approx(v), target
    with pytest.raises(ValueError, match="images=9"):
        zero_shot_segmentation(model, scenes.val, images=9)


def test_analyze_segment_on_a_trained_run(tmp_path, capsys):
    from attnzoo.analysis import cli as analyze_cli
    from attnzoo.train import cli as train_cli

    run = tmp_path / "run"
    args = [
        "scenes_crate_cbt_small",
        "--out",
        str(run),
        "--steps=2",
        "--eval_every=2",
        "--ckpt_every=2",
        "--batch_size=4",
        "--no-progress",
        "--task_options.n_train=16",
        "--task_options.n_val=8",
        "--task_options.img_size=32",
        "--model_options.dim=32",
        "--model_options.depth=2",
        "--model_options.second_attention_options={rep_grid: [2, 2]}",
    ]
    assert train_cli.main(args) == 0
    assert analyze_cli.main(["segment", str(run), "--images", "6", "--overlays", "2"]) == 0
    out = capsys.readouterr().out
    assert "best over layers and heads" in out
    result = json.loads((run / "segment" / "segment.json").read_text())
    assert [lay["mechanism"] for lay in result["layers"]] == ["mssa", "cbsa"]
    assert result["params"]["images"] == 6
    assert (run / "segment" / "segment.png").stat().st_size > 0
    assert (run / "segment" / "segment_overlays.png").stat().st_size > 0
    # a second call refuses to overwrite; a run of another task is refused by name
    assert analyze_cli.main(["segment", str(run)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert analyze_cli.main(["segment", str(tmp_path / "missing")]) == 2
    assert "config.yaml" in capsys.readouterr().err
