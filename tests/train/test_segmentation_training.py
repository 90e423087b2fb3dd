"""Segmentation decoders as an ``attnzoo train`` task: the scenes' semantic maps as targets, per-pixel
cross-entropy, whole-set mIoU; resume after a kill equals the uninterrupted run; a held run is refused; the decoder
sweep runs on a trained run."""

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from attnzoo._lock import DirectoryLocked, DirLock
from attnzoo.data import build_task
from attnzoo.train.checkpoint import latest_checkpoint
from attnzoo.train.config import load_config
from attnzoo.train.objectives import MetricAccumulator, compute_loss, confusion_matrix, mean_iou, metric_names
from attnzoo.train.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY_MODEL = {"dim": 32, "depth": 1, "heads": 4, "patch_size": 8, "decoder_depth": 1}
TINY_TASK = {"n_train": 48, "n_val": 8, "img_size": 32}


def _cfg(preset="scenes_cbsa_decoder_small", **kw):
    base = dict(
        task_options=TINY_TASK,
        model_options=TINY_MODEL,
        steps=8,
        batch_size=8,
        eval_every=4,
        ckpt_every=4,
        log_every=1,
        warmup_steps=2,
        lr=3e-3,
        seed=5,
    )
    return load_config(preset, {**base, **kw})


def test_the_task_targets_the_semantic_maps_of_the_same_scenes():
    seg = build_task("scenes_segmentation", **TINY_TASK)
    cls = build_task("scenes", **TINY_TASK)
    assert seg.kind == "semantic_segmentation" and seg.info["num_classes"] == cls.info["num_classes"] + 1 == 11
    (x,), target = seg.train.get_batch([0, 3])
    (x_cls,), labels = cls.train.get_batch([0, 3])
    assert torch.equal(x, x_cls) and labels.shape == (2,)
    assert target.shape == (2, 32, 32) and target.dtype == torch.int64
    assert torch.equal(target, cls.train.masks([0, 3])["semantic"])
    assert target.max() >= 1 and (target == 0).any()  # objects and background
    with pytest.raises(ValueError, match="target='instance'"):
        type(seg.train)(4, 0, 0, seg.train.sources, seg.train.spec, target="instance")


def test_miou_accumulates_the_confusion_of_every_pixel_by_hand():
    """Two batches of 2x2 maps, 3 classes: the mIoU of the summed confusion matrix, not the mean of batches'."""
    acc = MetricAccumulator("semantic_segmentation", {"num_classes": 3})
    t1, p1 = torch.tensor([[[0, 0], [1, 1]]]), torch.tensor([[[0, 1], [1, 1]]])
    t2, p2 = torch.tensor([[[2, 2], [0, 0]]]), torch.tensor([[[2, 0], [0, 0]]])
    for t, p in ((t1, p1), (t2, p2)):
        logits = torch.nn.functional.one_hot(p, 3).permute(0, 3, 1, 2).float()
        loss, _ = compute_loss("semantic_segmentation", logits, t)
        acc.update(loss, logits, t)
    out = acc.compute()
    # class 0: TP 3, FP 1 (a 2 read as 0), FN 1 (a 0 read as 1) -> 3/5; class 1: TP 2, FP 1 -> 2/3; class 2: 1/2
    assert out["miou"] == pytest.approx((3 / 5 + 2 / 3 + 1 / 2) / 3)
    assert out["pixel_accuracy"] == pytest.approx(6 / 8)
    assert metric_names("semantic_segmentation") == ["loss", "pixel_accuracy", "miou"]
    again = MetricAccumulator("semantic_segmentation", {"num_classes": 3})
    again.load_state(acc.state())  # the all-reduce path: one vector of sums
    assert again.compute() == out
    batch_means = [mean_iou(confusion_matrix(p, t, 3)) for t, p in ((t1, p1), (t2, p2))]
    assert out["miou"] != pytest.approx(sum(batch_means) / 2)


def test_a_segmenter_must_return_per_pixel_logits():
    with pytest.raises(ValueError, match=r"per-pixel logits \(B, K, H, W\).*got \(2, 3\)"):
        compute_loss("semantic_segmentation", torch.zeros(2, 3), torch.zeros(2, 4, 4, dtype=torch.long))


@pytest.mark.parametrize("preset", ["scenes_segmenter_small", "scenes_cbsa_decoder_small"])
def test_resume_after_a_kill_equals_the_uninterrupted_run(tmp_path, preset):
    cfg = _cfg(preset)
    full = train(cfg, tmp_path / "a", progress=False)

    def kill_at_5(step, loss):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)

    part = train(cfg, tmp_path / "b", progress=False, callback=kill_at_5)
    assert part.interrupted and part.step == 5
    rest = train(None, tmp_path / "b", resume=True, progress=False)
    assert rest.step == 8 and not rest.interrupted
    wa = load_file(str(latest_checkpoint(tmp_path / "a" / "checkpoints") / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "b" / "checkpoints") / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert set(full.final_metrics) == {"loss", "pixel_accuracy", "miou"}
    assert full.final_metrics == rest.final_metrics
    assert json.loads((tmp_path / "b" / "final.json").read_text())["val"] == full.final_metrics
    assert (tmp_path / "b" / "model" / "model.safetensors").is_file()


def test_a_run_another_writer_holds_is_refused_untouched(tmp_path):
    run = tmp_path / "held"
    with DirLock(run, what="run directory"):
        with pytest.raises(DirectoryLocked, match="in use"):
            train(_cfg(), run, progress=False)
        assert not (run / "config.yaml").exists() and not (run / "checkpoints").exists()


def test_the_decoder_sweep_runs_on_a_trained_run(tmp_path, capsys):
    from attnzoo.analysis import cli as analyze_cli
    from attnzoo.analysis.segment_decoders import load_segmenter_run

    run = tmp_path / "cbsa"
    done = train(_cfg(steps=4), run, progress=False)
    model, scenes = load_segmenter_run(run)
    assert model.config.decoder == "cbsa" and len(scenes) == TINY_TASK["n_val"]
    args = ["segment-decoders", str(run), "--sigmas", "0,0.5", "--draws", "1", "--images", "8"]
    assert analyze_cli.main(args) == 0
    result = json.loads((run / "segment-decoders" / "segment-decoders.json").read_text())
    row = result["decoders"]["cbsa"]
    # sigma 0 is the trained model itself: the mIoU its training run measured on the same 8 scenes
    assert row["miou"] == pytest.approx(done.final_metrics["miou"]) and row["sweep"]["miou"][0] == [row["miou"]]
    assert row["decoder_flops"] > 0 and row["decoder_params"] > 0
    other = tmp_path / "cls"
    train(load_config("digits_vit_tiny", {"steps": 1, "eval_every": 1, "ckpt_every": 1}), other, progress=False)
    assert analyze_cli.main(["segment-decoders", str(other), "--out", str(tmp_path / "x")]) == 2
    assert "needs a 'scenes_segmentation' run" in capsys.readouterr().err


def test_attnzoo_compare_reads_a_segmenter_by_its_miou():
    from attnzoo.compare.plan import default_metric, metric_direction

    assert default_metric("semantic_segmentation") == ("miou", True)
    assert metric_direction("miou") and metric_direction("accuracy") and not metric_direction("loss")
