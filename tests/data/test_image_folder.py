"""The ``image_folder`` task on a generated folder of small PNG/JPEG images: labels, augmentation determinism,
mixup/cutmix targets, DataLoader workers, training and bit-exact resume, bad inputs, and the ImageNet presets."""

import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from attnzoo.data.augment import RAND_AUGMENT_OPS, mix_batch, rand_augment
from attnzoo.data.tasks import build_task
from attnzoo.train.batches import train_batches
from attnzoo.train.checkpoint import latest_checkpoint
from attnzoo.train.config import list_presets, load_config
from attnzoo.train.distributed import BatchSchedule

CLASSES = ("ant", "bee", "cat")
PER_CLASS = 12
AUG = dict(img_size=16, randaugment_n=2, randaugment_m=9, mixup=0.8, cutmix=1.0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _make_folder(root: Path, classes=CLASSES, per_class=PER_CLASS, seed=0) -> Path:
    """Class k: horizontal stripes, vertical stripes or plain, around grey level 40 + 80 k, plus noise (a patch
    LayerNorm removes brightness, so the stripes are what a ViT learns from); every 4th image is a JPEG and every
    5th greyscale."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:16, 0:16]
    patterns = [(yy // 2) % 2, (xx // 2) % 2, np.zeros((16, 16), int)]
    for k, name in enumerate(classes):
        d = root / name
        d.mkdir(parents=True)
        for i in range(per_class):
            a = 40 + 80 * k + 70 * patterns[k % 3][..., None] + rng.normal(0, 15, (16, 16, 3))
            img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
            if i % 5 == 1:
                img = img.convert("L")
            img.save(d / (f"img{i:02d}.jpg" if i % 4 == 0 else f"img{i:02d}.png"))
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return _make_folder(tmp_path_factory.mktemp("images") / "flat")


@pytest.fixture(scope="module")
def split_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images") / "split"
    _make_folder(root / "train", seed=1)
    _make_folder(root / "val", classes=CLASSES[:2], per_class=3, seed=2)  # a val folder may lack a class
    return root


def test_labels_follow_the_class_folders(folder, split_folder):
    t = build_task("image_folder", root=str(folder), img_size=16, val_fraction=0.25, seed=5)
    assert t.kind == "image_classification" and t.info["classes"] == list(CLASSES)
    assert (t.info["num_classes"], t.info["in_chans"], t.info["img_size"]) == (3, 3, 16)
    assert len(t.train) + len(t.val) == 3 * PER_CLASS and len(t.val) == 3 * 3  # 25% of each class
    for ds in (t.train, t.val):
        names = [Path(f).parent.name for f in ds.files]
        assert [CLASSES[c] for c in ds.labels] == names
    assert not set(t.train.files) & set(t.val.files)
    # the evaluation view is deterministic and the grey levels order the classes as the folders do
    (x,), y = t.val.get_batch(np.arange(len(t.val)))
    assert x.shape == (9, 3, 16, 16) and y.dtype == torch.int64
    means = [float(x[y == c].mean()) for c in range(3)]
    assert means[0] < means[1] < means[2]
    assert torch.equal(t.val.get_batch(np.arange(3))[0][0], x[:3])
    # another split seed picks other validation images; the same seed the same ones
    assert build_task("image_folder", root=str(folder), img_size=16, val_fraction=0.25, seed=5).val.files == t.val.files
    assert build_task("image_folder", root=str(folder), img_size=16, val_fraction=0.25, seed=6).val.files != t.val.files

    s = build_task("image_folder", root=str(split_folder), img_size=16)
    assert (len(s.train), len(s.val), s.info["num_classes"]) == (3 * PER_CLASS, 6, 3)
    assert all(Path(f).parts[-3] == "val" for f in s.val.files)
    assert [CLASSES[c] for c in s.val.labels] == [Path(f).parent.name for f in s.val.files]


def test_augmentation_is_a_function_of_seed_step_and_index(folder):
    t = build_task("image_folder", root=str(folder), val_fraction=0.25, **AUG)
    idx = np.array([4, 0, 7, 11])
    (a,), ya = t.train.get_batch(idx, step=3)
    (b,), yb = t.train.get_batch(idx, step=3)
    assert torch.equal(a, b) and torch.equal(ya, yb)
    (c,), _ = t.train.get_batch(idx, step=4)
    assert not torch.equal(a, c)
    # a sample's pixels don't depend on the batch it sits in (without mixing)
    plain = build_task("image_folder", root=str(folder), val_fraction=0.25, img_size=16, randaugment_n=2)
    (p,), _ = plain.train.get_batch(idx, step=3)
    (q,), _ = plain.train.get_batch(idx[[2, 0]], step=3)
    assert torch.equal(p[[2, 0]], q)
    # another seed, other augmentations (same split fraction: the split also moves, compare a batch anyway)
    other = build_task("image_folder", root=str(folder), val_fraction=0.25, seed=1, **AUG)
    assert not torch.equal(other.train.get_batch(idx, step=3)[0][0], a)


def test_every_rand_augment_op_is_deterministic_and_keeps_the_size():
    # a narrow grey range (autocontrast has work to do) over enough pixels for equalize to act
    img = Image.fromarray(np.random.default_rng(0).integers(60, 180, (40, 30, 3), dtype=np.uint8))
    changed = 0
    for name, op in RAND_AUGMENT_OPS.items():
        out = op(img, 0.9, -1.0)
        assert out.size == img.size and out.mode == "RGB", name
        assert np.array_equal(np.asarray(out), np.asarray(op(img, 0.9, -1.0))), name
        changed += not np.array_equal(np.asarray(out), np.asarray(img))
    assert changed == len(RAND_AUGMENT_OPS) - 1  # all but identity alter the image at magnitude 9
    a = rand_augment(img, 3, 9, np.random.default_rng([1, 2]))
    assert np.array_equal(np.asarray(a), np.asarray(rand_augment(img, 3, 9, np.random.default_rng([1, 2]))))


@pytest.mark.parametrize("mixup, cutmix", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixup_cutmix_targets_sum_to_one(mixup, cutmix):
    x = torch.randn(6, 3, 8, 8)
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    mixed_any = False
    for s in range(10):
        xm, t = mix_batch(x, y, 5, np.random.default_rng(s), mixup_alpha=mixup, cutmix_alpha=cutmix)
        assert t.shape == (6, 5) and t.dtype == torch.float32
        torch.testing.assert_close(t.sum(1), torch.ones(6))
        # the weight of a sample's own class equals the fraction of it left in the image (sample 1 of class 1
        # is mixed with sample 4 of class 4)
        lam = float(t[1, 1])
        assert float(t[1, 4]) == pytest.approx(1 - lam)
        if lam < 1:
            mixed_any = True
            if cutmix and not mixup:
                assert int((xm[1] == x[1]).all(0).sum()) == round(lam * 64)
            if mixup and not cutmix:
                torch.testing.assert_close(xm[1], lam * x[1] + (1 - lam) * x[4])
    assert mixed_any


def test_mixed_training_batches_have_soft_targets(folder):
    t = build_task("image_folder", root=str(folder), val_fraction=0.25, **AUG)
    idx = np.arange(0, 24, 3)  # the training files are sorted by class: this batch spans all three
    assert len(set(t.train.labels[idx].tolist())) == 3
    (x,), y = t.train.get_batch(idx, step=0)
    assert x.shape == (8, 3, 16, 16) and y.shape == (8, 3) and torch.allclose(y.sum(1), torch.ones(8))
    assert not torch.equal(y, y.round())  # some mixing happened in this batch
    (xv,), yv = t.val.get_batch(np.arange(4))
    assert xv.shape == (4, 3, 16, 16) and yv.shape == (4,) and yv.dtype == torch.int64  # validation is never mixed


def test_batches_do_not_depend_on_num_workers(folder):
    batches, val = {}, {}
    for w in (0, 2):
        t = build_task("image_folder", root=str(folder), val_fraction=0.25, num_workers=w, **AUG)
        sched = BatchSchedule(len(t.train), 9, seed=0)
        batches[w] = list(train_batches(t.train, sched, 2, 6))
        val[w] = t.val.get_batch(np.arange(len(t.val)))[0][0]  # evaluation decodes on num_workers threads
        # a spawned worker gets a pickled copy (without the thread pool)
        assert torch.equal(pickle.loads(pickle.dumps(t.val)).get_batch(np.arange(3))[0][0], val[w][:3])
    assert torch.equal(val[0], val[2])
    assert len(batches[0]) == len(batches[2]) == 4
    for ((xa,), ya), ((xb,), yb) in zip(batches[0], batches[2], strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def _cfg(folder, **kw):
    base = dict(
        task="image_folder",
        task_options={"root": str(folder), "val_fraction": 0.25, **AUG},
        model="vit_cifar",
        model_options={"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 32, "patch_size": 4, "dropout": 0.1},
        steps=8,
        batch_size=9,
        lr=3e-3,
        eval_every=8,
        log_every=1,
        ckpt_every=4,
        seed=3,
        label_smoothing=0.1,
        warmup_steps=2,
    )
    return load_config(None, {**base, **kw})


def test_train_and_resume_bit_exactly(folder, tmp_path):
    from attnzoo.train.trainer import train

    full = train(_cfg(folder), tmp_path / "a", progress=False)
    assert full.step == 8 and len(full.train_losses) == 8
    assert all(np.isfinite(loss) for _, loss in full.train_losses) and 0 <= full.final_metrics["accuracy"] <= 1

    def kill_at_5(step, loss):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)

    part = train(_cfg(folder), tmp_path / "b", progress=False, callback=kill_at_5)
    assert part.interrupted and part.step == 5
    rest = train(None, tmp_path / "b", resume=True, progress=False)
    assert rest.step == 8 and rest.train_losses == full.train_losses[5:]
    wa = load_file(str(latest_checkpoint(tmp_path / "a" / "checkpoints") / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "b" / "checkpoints") / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert full.final_metrics == rest.final_metrics


def test_cli_trains_on_a_folder(folder, tmp_path):
    from attnzoo.train import cli as train_cli

    run, config = tmp_path / "cli", tmp_path / "folder.yaml"
    config.write_text(
        f"task: image_folder\ntask_options:\n  root: {folder}\n  img_size: 16\n  val_fraction: 0.25\n"
        "  mixup: 0.8\n  cutmix: 1.0\n  randaugment_n: 2\nmodel: vit_cifar\nlabel_smoothing: 0.1\n"
    )
    args = [
        str(config),
        "--out",
        str(run),
        "--no-progress",
        "--model_options.dim=16",
        "--model_options.depth=1",
        "--model_options.heads=2",
        "--model_options.mlp_dim=32",
        "--model_options.patch_size=4",
        "--task_options.num_workers=1",
        "--steps=3",
        "--batch_size=6",
        "--eval_every=3",
        "--log_every=1",
    ]
    assert train_cli.main(args) == 0
    assert (run / "final.json").is_file() and (run / "model" / "model.safetensors").is_file()


def test_a_tiny_vit_learns_the_folder(folder, tmp_path):
    from attnzoo.train.trainer import train

    # random resized crop + flip (the CBT/CRATE recipe): 40 steps separate the three stripe classes
    cfg = _cfg(
        folder,
        task_options={"root": str(folder), "val_fraction": 0.25, "img_size": 16},
        steps=40,
        eval_every=40,
        log_every=10,
        model_options={"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 32, "patch_size": 4},
    )
    res = train(cfg, tmp_path / "learn", progress=False)
    assert res.train_losses[-1][1] < res.train_losses[0][1]
    assert res.final_metrics["loss"] < 0.8 * np.log(3) and res.final_metrics["accuracy"] >= 7 / 9


# ---- bad inputs --------------------------------------------------------------------------------------
def _err(root, match, **kw):
    with pytest.raises(ValueError, match=match):
        t = build_task("image_folder", root=str(root), img_size=16, **kw)
        for ds in (t.train, t.val):
            ds.get_batch(np.arange(len(ds)))


def test_bad_folders_name_the_offending_path(tmp_path):
    _err(tmp_path / "missing", r"root=.*missing.* is not a folder \(it does not exist\)")
    (tmp_path / "nocls").mkdir()
    _err(tmp_path / "nocls", r"nocls has no class sub-folders")
    root = _make_folder(tmp_path / "empty", per_class=2)
    (root / "dog").mkdir()
    _err(root, r"class folder .*empty/dog holds no PNG/JPEG images")
    root = _make_folder(tmp_path / "text", per_class=2)
    (root / "bee" / "notes.txt").write_text("hello")
    _err(root, r".*text/bee/notes.txt is not a PNG/JPEG image")
    # a broken file with an image extension: caught by the header check, or when decoded without it
    root = _make_folder(tmp_path / "broken", per_class=2)
    (root / "cat" / "img99.png").write_bytes(b"not a png at all")
    _err(root, r"unreadable image file .*broken/cat/img99.png")
    _err(root, r"unreadable image file .*broken/cat/img99.png", verify=False)
    root = _make_folder(tmp_path / "truncated", per_class=2)  # a valid header, cut-off pixel data
    data = (root / "bee" / "img01.png").read_bytes()
    (root / "bee" / "img01.png").write_bytes(data[: len(data) // 2])
    _err(root, r"unreadable image file .*truncated/bee/img01.png")
    root = _make_folder(tmp_path / "gif", per_class=2)
    Image.new("RGB", (4, 4)).save(root / "ant" / "x.png", format="GIF")
    _err(root, r"image file .*gif/ant/x.png is a GIF image; only PNG and JPEG")
    root = _make_folder(tmp_path / "half" / "train", per_class=2)
    _err(tmp_path / "half", r"has a train/ folder but no val/ folder")
    _err(tmp_path / "half" / "train", r"val_fraction=1.5 must lie in \(0, 1\)", val_fraction=1.5)


def test_bad_options_are_rejected_before_reading(tmp_path):
    missing = tmp_path / "never-read"
    for kw, match in [
        ({"hflip": 1.5}, "hflip=1.5 must lie in"),
        ({"mixup": -1.0}, "mixup=-1.0 must be >= 0"),
        ({"mean": [0.5, 0.5]}, "mean=.* list of 3 numbers"),
        ({"std": [1, 0, 1]}, "all > 0"),
        ({"crop_scale_min": 0.0}, "crop_scale_min=0.0 must lie in"),
        ({"randaugment_m": 11.0}, r"randaugment_m=11.0 must lie in \[0.0, 10.0\]"),
    ]:
        _err(missing, match, **kw)
    with pytest.raises(TypeError, match="num_workers"):
        build_task("image_folder", root=str(missing), num_workers="two")


# ---- the ImageNet presets ------------------------------------------------------------------------------
IMAGENET_PRESETS = {
    "imagenet_tost_s": "tost_s",
    "imagenet_cbt_s": "cbt_s",
    "imagenet_crate_s": "crate_s",
    "imagenet_aot_b": "aot_vision_b",
    "imagenet_xcit_s": "xcit_s",
}


@pytest.mark.parametrize("preset, model", sorted(IMAGENET_PRESETS.items()))
def test_imagenet_presets_build_the_papers_models(preset, model):
    from attnzoo.models import count_parameters, model_entry

    assert preset in list_presets()
    cfg = load_config(preset).validate()
    assert cfg.model == model and cfg.task == "image_folder" and cfg.task_options["img_size"] == 224
    # what the trainer builds for a 1000-class folder at the preset's size: the registered (paper) model
    n = count_parameters(cfg.model, num_classes=1000, image_size=224, in_chans=3, **cfg.resolved_model_options())
    assert n == count_parameters(model)
    entry = model_entry(model)
    assert abs(n - entry.paper_params * entry.paper_params_unit) / (entry.paper_params * entry.paper_params_unit) < 0.05
