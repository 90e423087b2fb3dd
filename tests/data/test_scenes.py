"""Scenes with exact masks: deterministic per (seed, index), exact masks, the documented label, no trivial cue."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnzoo.data import build_task, list_tasks
from attnzoo.data.scenes import SceneDataset, SceneSpec, boundary_band, render_scene, scene_masks


@pytest.fixture(scope="module")
def task():
    return build_task("scenes", n_train=800, n_val=300)


def test_registered_with_image_batches(task):
    assert "scenes" in list_tasks()
    (x,), y = task.train.get_batch(np.arange(4))
    assert task.kind == "image_classification"
    assert x.shape == (4, 1, 64, 64) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert task.info["num_classes"] == 10 and task.info["img_size"] == 64 and task.info["in_chans"] == 1
    m = task.val.masks(np.arange(4))
    assert set(m) == {"instance", "semantic", "foreground", "background", "boundary"}
    assert all(v.shape == (4, 64, 64) for v in m.values())


def test_a_scene_is_a_function_of_seed_and_index(task):
    fresh = build_task("scenes", n_train=800, n_val=300)
    (a,), ya = task.train.get_batch(np.array([7, 3, 500]))
    (b,), yb = fresh.train.get_batch(np.array([500, 7]))  # another order, another dataset object
    torch.testing.assert_close(a[[2, 0]], b)
    assert ya[[2, 0]].tolist() == yb.tolist()
    other = build_task("scenes", n_train=800, n_val=300, seed=1)
    assert not torch.equal(other.train.get_batch(np.array([7]))[0][0], a[:1])
    assert not torch.equal(task.val.get_batch(np.array([7]))[0][0], a[:1])  # validation is another stream


def test_masks_agree_with_each_other_and_the_label(task):
    idx = np.arange(64)
    m = task.train.masks(idx)
    inst, sem = m["instance"], m["semantic"]
    assert torch.equal(m["foreground"], inst > 0) and torch.equal(m["foreground"], sem > 0)
    assert torch.equal(m["background"], ~m["foreground"])
    for b, i in enumerate(idx):
        s = task.train.scene(i)
        for k, cls in enumerate(s.classes, start=1):
            assert torch.all(sem[b][inst[b] == k] == cls + 1)
        visible = torch.bincount(inst[b].flatten(), minlength=len(s.classes) + 1)[1:]
        assert s.label == s.classes[int(visible.argmax())]  # the class of the most visible object
    counts = [len(task.train.scene(i).classes) for i in idx]
    assert set(counts) == {1, 2, 3}


def test_masks_are_exact_for_a_solid_source():
    # a solid square source: its object is exactly a square, drawn exactly where its mask says
    sources = (np.full((1, 4, 4), 255, np.uint8), np.array([7]))
    spec = SceneSpec(canvas=32, min_objects=1, max_objects=1, main_size=(0.25, 0.25), noise_std=0.0)
    s = render_scene(np.random.default_rng(0), sources, spec)
    ys, xs = np.nonzero(s.instance)
    assert (ys.max() - ys.min() + 1, xs.max() - xs.min() + 1, len(ys)) == (8, 8, 64)
    assert s.classes == (7,) and s.label == 7
    inside = s.image[s.instance > 0].astype(int)
    assert inside.min() == inside.max() >= 0.45 * 0.7 * 255  # one appearance value on the whole object
    assert s.image[s.instance == 0].max() < inside.min()


def test_the_label_is_the_most_visible_object_not_the_first():
    sources = (np.full((2, 4, 4), 255, np.uint8), np.array([3, 8]))
    spec = SceneSpec(canvas=32, min_objects=2, max_objects=2, main_size=(0.2, 0.2), other_size=(0.6, 0.6))
    for seed in range(6):
        s = render_scene(np.random.default_rng(seed), sources, spec)
        visible = np.bincount(s.instance.ravel(), minlength=3)[1:]
        assert visible[1] > visible[0]  # the second object, drawn on top, is the bigger one
        assert s.label == s.classes[1]


def test_boundary_band_by_hand():
    regions = np.zeros((6, 6), np.int8)
    regions[2:4, 2:4] = 1
    band = boundary_band(regions, 2)
    expected = np.zeros((6, 6), bool)
    expected[1:5, 1:5] = True  # the square (all of it lies on its edge) and the ring around it
    np.testing.assert_array_equal(band, expected)
    wide = boundary_band(regions, 4)
    assert wide.all()  # within 2 pixels of the square: the whole 6x6 canvas
    # object-object edges count, the canvas border does not
    two = np.array([[1, 1, 2, 2]], np.int8).repeat(3, 0)
    np.testing.assert_array_equal(boundary_band(two, 2)[1], [False, True, True, False])
    m = scene_masks(regions[None], [(4,)], 2)
    assert m["semantic"][0, 2, 2] == 5 and m["semantic"][0, 0, 0] == 0


@pytest.mark.parametrize(
    "options, match",
    [
        ({"max_objects": 0}, "max_objects"),
        ({"min_objects": 3, "max_objects": 2}, "min_objects"),
        ({"boundary_width": 3}, "boundary_width=3"),
        ({"img_size": 8}, "img_size=8"),
        ({"noise_std": 2.0}, "noise_std"),
    ],
)
def test_bad_options_name_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        build_task("scenes", n_train=4, n_val=4, **options)


def test_scene_index_out_of_range(task):
    with pytest.raises(IndexError, match="out of range"):
        task.val.scene(300)
    with pytest.raises(ValueError, match="n >= 1"):
        SceneDataset(0, 0, 0, task.val.sources, task.val.spec)


def _features(ds: SceneDataset, n: int) -> dict[str, np.ndarray]:
    idx = np.arange(n)
    px = ds.pixels(idx)
    fg = ds.masks(idx)["foreground"].numpy()
    counts = [len(ds.scene(i).classes) for i in idx]
    stats = np.stack([px.mean((1, 2)), px.std((1, 2)), np.percentile(px, 90, axis=(1, 2)), fg.mean((1, 2)), counts], 1)
    b, h, w = px.shape
    patches = px.reshape(b, h // 8, 8, w // 8, 8).transpose(0, 1, 3, 2, 4).reshape(b, -1, 64)
    bag = np.concatenate([patches.mean(1), patches.std(1)], 1)  # mean-pooled patch features: no layout
    crops = []  # the most visible object cut out by its mask's box: what a model that finds the layout sees
    for j, i in enumerate(idx):
        inst = ds.scene(i).instance
        k = 1 + int(np.argmax(np.bincount(inst.ravel(), minlength=9)[1:]))
        ys, xs = np.nonzero(inst == k)
        crop = torch.from_numpy(px[j, ys.min() : ys.max() + 1, xs.min() : xs.max() + 1])
        side = max(crop.shape)
        crop = F.pad(crop, (0, side - crop.shape[1], 0, side - crop.shape[0]))
        crops.append(F.adaptive_avg_pool2d(crop[None], 8).flatten().numpy())
    return {"stats": stats, "bag": bag, "oracle": np.stack(crops)}


def test_no_trivial_cue_solves_the_scenes(task):
    from sklearn.linear_model import RidgeClassifier
    from sklearn.preprocessing import StandardScaler

    tr, va = _features(task.train, 800), _features(task.val, 300)
    ytr = task.train.get_batch(np.arange(800))[1].numpy()
    yva = task.val.get_batch(np.arange(300))[1].numpy()
    acc = {}
    for name in tr:
        scale = StandardScaler().fit(tr[name])
        clf = RidgeClassifier(alpha=10.0).fit(scale.transform(tr[name]), ytr)
        acc[name] = clf.score(scale.transform(va[name]), yva)
    # measured (seed 0, 800/300 scenes): stats 0.15, bag of patches 0.08, oracle crop 0.89; chance is 0.10
    assert acc["stats"] < 0.25 and acc["bag"] < 0.25, acc
    assert acc["oracle"] > 0.75, acc
    assert acc["oracle"] - max(acc["stats"], acc["bag"]) > 0.5, acc
