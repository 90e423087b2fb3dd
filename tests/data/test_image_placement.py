"""Images on a larger canvas: centred, or placed anywhere at an offset fixed per image."""

import numpy as np
import pytest
import torch

from attnzoo.data import build_task
from attnzoo.data.datasets import ImageDataset


def _dataset(placement: str, seed: int = 0, n: int = 40) -> ImageDataset:
    rng = np.random.default_rng(3)
    images = rng.integers(1, 256, size=(n, 6, 5), dtype=np.uint8)  # no black pixel: every image pixel is visible
    return ImageDataset(images, np.arange(n) % 3, 0.5, 0.25, 12, placement, seed=seed)


def _image_pixels(ds: ImageDataset, k: int) -> np.ndarray:
    """Where image ``k`` lies on its canvas: the pixels that differ from the background."""
    (x,), _ = ds.get_batch(np.array([k]))
    return (x[0, 0] != -ds.mean / ds.std).nonzero().numpy()


def test_centred_images_sit_in_the_middle_of_the_canvas():
    ds = _dataset("center")
    (x,), _ = ds.get_batch(np.arange(3))
    assert x.shape == (3, 1, 12, 12)
    rows, cols = _image_pixels(ds, 0).T
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (3, 8, 3, 7)


def test_random_placement_keeps_each_image_whole_at_its_own_offset():
    ds = _dataset("random")
    (x,), _ = ds.get_batch(np.arange(len(ds)))
    for k, (top, left) in enumerate(ds.offsets):
        expected = torch.from_numpy(ds.images[k, 0]).float().div(255.0).sub(ds.mean).div(ds.std)
        torch.testing.assert_close(x[k, 0, top : top + 6, left : left + 5], expected)
        rows, cols = _image_pixels(ds, k).T
        assert (rows.min(), rows.max(), cols.min(), cols.max()) == (top, top + 5, left, left + 4)
    # offsets cover the canvas (12 - 6 + 1 rows, 12 - 5 + 1 columns of corners), not one place
    assert len({tuple(o) for o in ds.offsets}) > 10
    assert ds.offsets[:, 0].max() <= 6 and ds.offsets[:, 1].max() <= 7 and ds.offsets.min() >= 0


def test_random_placement_is_fixed_per_image_and_by_seed():
    a, b, c = _dataset("random"), _dataset("random"), _dataset("random", seed=1)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    assert not np.array_equal(a.offsets, c.offsets)
    # a batch in another order puts each image at the same place
    (x1,), _ = a.get_batch(np.array([4, 9]))
    (x2,), _ = a.get_batch(np.array([9, 4]))
    torch.testing.assert_close(x1, x2.flip(0))


def test_unknown_placement_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"placement='corner'.*center, random"):
        _dataset("corner")


def test_fashion_mnist_task_places_its_splits_apart():
    t = build_task("fashion_mnist", n_train=30, n_val=30, img_size=40, placement="random")
    (x,), _ = t.train.get_batch(np.arange(4))
    assert x.shape == (4, 1, 40, 40) and t.info["img_size"] == 40
    assert not np.array_equal(t.train.offsets, t.val.offsets)
    centred = build_task("fashion_mnist", n_train=30, n_val=30, img_size=40)
    assert (centred.train.offsets == 6).all()
