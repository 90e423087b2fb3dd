"""The task registry: every task kind yields the documented batch shapes; options are validated early."""

import numpy as np
import pytest
import torch

from attnzoo.data import GeneratedDataset, build_task, list_tasks
from attnzoo.data.tasks import task_kind


def _batch(task, n=3):
    return task.train.get_batch(np.arange(n))


def test_image_task_shapes():
    t = build_task("digits", img_size=10)
    (x,), y = _batch(t)
    assert t.kind == "image_classification"
    assert x.shape == (3, 1, 10, 10) and x.dtype == torch.float32 and y.shape == (3,) and y.dtype == torch.int64
    assert t.info == {**t.info, "num_classes": 10, "in_chans": 1, "img_size": 10}
    # padding uses the normalised value of a black pixel
    assert torch.allclose(x[:, :, 0, :], torch.tensor(-t.info["mean"] / t.info["std"]))
    (x_full,), _ = t.val.get_batch(np.arange(len(t.val)))
    assert abs(float(x_full[:, :, 1:9, 1:9].mean())) < 0.2  # roughly normalised


def test_fashion_mnist_task_subset():
    t = build_task("fashion_mnist", n_train=50, n_val=20, img_size=32)
    assert len(t.train) == 50 and len(t.val) == 20
    (x,), y = _batch(t)
    assert x.shape == (3, 1, 32, 32)


def test_sequence_tasks_shapes():
    t = build_task("lra_listops", n_train=6, n_val=2, min_len=10, max_len=50)
    (ids,), y = _batch(t)
    assert t.kind == "sequence_classification" and ids.shape == (3, 50) and ids.dtype == torch.int64
    assert int(ids.max()) < t.info["vocab_size"] and 0 <= int(y.min()) and int(y.max()) < 10
    t = build_task("lra_pathfinder", n_train=4, n_val=2)
    (ids,), y = _batch(t)
    assert ids.shape == (3, 1024) and int(ids.max()) <= 255 and set(y.tolist()) <= {0, 1}
    t = build_task("lra_image", dataset="digits")
    (ids,), y = _batch(t)
    assert ids.shape == (3, 64) and t.info["vocab_size"] == 256
    # size pads to LRA's square canvas: the pixels are centred, the border is black (token 0)
    t12 = build_task("lra_image", dataset="digits", size=12)
    (ids12,), y12 = _batch(t12)
    assert ids12.shape == (3, 144) and torch.equal(y12, y) and t12.info["seq_len"] == 144
    img = ids12.view(3, 12, 12)
    assert torch.equal(img[:, 2:10, 2:10].reshape(3, 64), ids) and int(img[:, :2].abs().sum()) == 0
    with pytest.raises(ValueError, match=r"size must be an int >= the images. side \(digits: 8x8\), got 7"):
        build_task("lra_image", dataset="digits", size=7)


def test_text_and_retrieval_tasks():
    t = build_task("lra_text", seq_len=128, n_train=10, n_val=5)
    (ids,), y = _batch(t)
    assert ids.shape == (3, 128) and int(ids.max()) <= 256 and len(t.val) == 5
    t = build_task("lra_retrieval", seq_len=64, n_train=8, n_val=4)
    (a, b), y = _batch(t)
    assert t.kind == "pair_classification" and a.shape == b.shape == (3, 64)


def test_language_model_task():
    t = build_task("shakespeare_char", block_size=16)
    (x,), y = t.train.get_batch(np.array([0, 100]))
    assert x.shape == y.shape == (2, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert t.vocab.decode(x[0].tolist()) in t.vocab.decode(t.train.tokens[:40].tolist())
    assert set(t.info["val_works"]).isdisjoint(t.info["train_works"])


def test_language_model_task_train_chars():
    full = build_task("shakespeare_char", block_size=16)
    t = build_task("shakespeare_char", block_size=16, train_chars=50_000)
    # the first characters of the same text, the same vocabulary and validation plays
    assert len(t.train.tokens) == t.info["train_chars"] == 50_000
    assert torch.equal(t.train.tokens, full.train.tokens[:50_000])
    assert t.vocab.chars == full.vocab.chars and torch.equal(t.val.tokens, full.val.tokens)
    assert t.train.doc_starts.max() < 50_000 and t.train.doc_starts[0] == 0
    for bad in (0, 17, 10**9):
        with pytest.raises(ValueError, match="train_chars must be an integer"):
            build_task("shakespeare_char", block_size=16, train_chars=bad)


def test_icl_tasks():
    t = build_task("icl_sparse_linear", dim=6, n_points=9)
    (xs, ys), target = _batch(t)
    assert xs.shape == (3, 9, 6) and ys.shape == target.shape == (3, 9)
    assert task_kind("icl_linear") == "icl_regression"
    assert t.train.shuffle is False  # an i.i.d. stream is read in order


def test_generated_samples_do_not_depend_on_order_or_cache():
    make = lambda rng: ((rng.standard_normal(3).astype(np.float32),), np.int64(rng.integers(9)))  # noqa: E731
    a = GeneratedDataset(10, (1, 0), make)
    b = GeneratedDataset(10, (1, 0), make, cache=False)
    (xa,), ya = a.get_batch([3, 7])
    (xb,), yb = b.get_batch([7, 3])
    assert torch.equal(xa, xb.flip(0)) and torch.equal(ya, yb.flip(0))
    (xc,), _ = GeneratedDataset(10, (2, 0), make).get_batch([3, 7])
    assert not torch.equal(xa, xc)
    with pytest.raises(IndexError, match="out of range"):
        a.get_batch([10])


def test_bad_task_and_options():
    with pytest.raises(ValueError, match=r"unknown task 'cifar'; valid tasks: \[.*'digits'"):
        build_task("cifar")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['seqlen'\]; valid options: \[.*'seq_len'"):
        build_task("lra_text", seqlen=5)
    with pytest.raises(TypeError, match="n_train='many'.*expected int"):
        build_task("lra_listops", n_train="many")
    with pytest.raises(ValueError, match="missing required option"):
        build_task("idx_images")
    with pytest.raises(TypeError, match="'cifar'"):
        build_task("lra_image", dataset="cifar")
    assert "lra_pathx" in list_tasks()


def test_window_dataset_covers_the_stream():
    from attnzoo.data import WindowDataset

    tokens = np.arange(11)
    train = WindowDataset(tokens, 3)
    assert len(train) == 8  # offsets 0..7: the last target is token 10
    (x,), y = train.get_batch([7])
    assert x.tolist() == [[7, 8, 9]] and y.tolist() == [[8, 9, 10]]
    val = WindowDataset(tokens, 3, stride=3)
    (x,), y = val.get_batch(np.arange(len(val)))
    assert x.flatten().tolist() == list(range(9)) and y[-1].tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="longer than block_size"):
        WindowDataset(tokens, 11)
