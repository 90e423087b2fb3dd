"""LRA-style generators: ListOps against an independent evaluator, Pathfinder against a connectivity
check on the rendered image (scipy.ndimage), Retrieval's labels, byte encoding, ICL prompts."""
import numpy as np
import pytest
from scipy import ndimage

from attnzoo.data.icl import icl_sample, least_squares_baseline
from attnzoo.data.lra import (DOT_VALUE, LISTOPS_VOCAB, encode_bytes, listops_evaluate, listops_sample,
                              listops_to_string, pathfinder_sample, retrieval_sample)


@pytest.mark.parametrize("expr, value", [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MED 1 2 3 4 ]", 2),  # LRA: int(np.median) of an even count truncates the mean
    ("[MED 7 1 5 ]", 5),
    ("[SM 5 7 [SM 9 9 ] ]", 0),
    ("[MIN [MAX 1 2 ] [MED 8 9 3 ] ]", 2),
    ("4", 4),
])
def test_listops_evaluator_known_values(expr, value):
    assert listops_evaluate(expr) == value


@pytest.mark.parametrize("bad", ["[MAX 1 2", "[MAX 1 ] ]", "[FOO 1 ]", "[MAX ]"])
def test_listops_evaluator_rejects_malformed(bad):
    with pytest.raises(ValueError):
        listops_evaluate(bad)


def test_listops_labels_match_independent_evaluator():
    rng = np.random.default_rng(0)
    values = []
    for _ in range(40):
        tokens, value = listops_sample(rng, min_len=20, max_len=120, max_depth=6, max_args=5)
        assert 20 <= len(tokens) <= 120
        assert all(0 < t < LISTOPS_VOCAB for t in tokens)
        assert listops_evaluate(listops_to_string(tokens)) == value
        values.append(value)
    assert len(set(values)) >= 5
    long_tokens, long_value = listops_sample(np.random.default_rng(1), min_len=1500, max_len=2000)
    assert 1500 <= len(long_tokens) <= 2000
    assert listops_evaluate(listops_to_string(long_tokens)) == long_value


def test_listops_is_deterministic_by_seed():
    a = listops_sample(np.random.default_rng([5, 3]), 10, 60)
    b = listops_sample(np.random.default_rng([5, 3]), 10, 60)
    c = listops_sample(np.random.default_rng([5, 4]), 10, 60)
    assert a == b and a != c


def _connected(img: np.ndarray, gap: int) -> bool:
    """Independent check: are the two dots in one 8-connected component after closing the dash gaps?"""
    r = (gap + 1) // 2
    ink = ndimage.binary_dilation(img > 0, structure=np.ones((3, 3), bool), iterations=r)
    comps, _ = ndimage.label(ink, structure=np.ones((3, 3)))
    dots, n_dots = ndimage.label(img == DOT_VALUE, structure=np.ones((3, 3)))
    assert n_dots == 2, "every image shows exactly two dots"
    ids = {int(comps[dots == k][0]) for k in (1, 2)}
    return len(ids) == 1


@pytest.mark.parametrize("size, n", [(16, 30), (32, 40), (128, 4)])
def test_pathfinder_labels_match_connectivity(size, n):
    labels = []
    for i in range(n):
        img, label = pathfinder_sample(np.random.default_rng([7, i]), size=size)
        assert img.shape == (size, size) and img.dtype == np.uint8
        assert _connected(img, gap=1) == bool(label)
        labels.append(label)
    assert 0 < sum(labels) < n  # both classes occur


def test_pathfinder_wider_gaps_still_consistent():
    for i in range(10):
        img, label = pathfinder_sample(np.random.default_rng([8, i]), size=48, gap=2, dash=2)
        assert _connected(img, gap=2) == bool(label)


def test_pathfinder_deterministic_and_validated():
    a = pathfinder_sample(np.random.default_rng(3))
    b = pathfinder_sample(np.random.default_rng(3))
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1]
    with pytest.raises(ValueError, match="n_paths >= 2"):
        pathfinder_sample(np.random.default_rng(0), n_paths=1)


def test_encode_bytes_pads_and_truncates():
    np.testing.assert_array_equal(encode_bytes("ab", 4), [98, 99, 0, 0])
    np.testing.assert_array_equal(encode_bytes("é", 1), [0xC3 + 1])
    assert encode_bytes("x" * 10, 3).tolist() == [121] * 3


def test_retrieval_labels_and_disjoint_passages():
    length = 30
    # documents of constant bytes reveal where a passage came from; document 0 counts up to test overlap
    docs = [np.arange(100, dtype=np.uint8)] + [np.full(70 + 10 * k, 50 + k, np.uint8) for k in range(3)]
    seen = set()
    for i in range(60):
        (a, b), label = retrieval_sample(np.random.default_rng([2, i]), docs, length)
        assert a.shape == b.shape == (length,)
        # tokens are bytes + 1: the constant documents give tokens 51..53 (document 1..3)
        src = lambda p: 0 if len(set(p.tolist())) > 1 else int(p[0]) - 50  # noqa: E731
        assert (src(a) == src(b)) == bool(label)
        if label and src(a) == 0:
            assert not set(a.tolist()) & set(b.tolist())
        seen.add(label)
    assert seen == {0, 1}


@pytest.mark.parametrize("sparsity", [None, 3])
def test_icl_prompts(sparsity):
    (xs, ys), target = icl_sample(np.random.default_rng(0), dim=20, n_points=41, sparsity=sparsity)
    assert xs.shape == (41, 20) and ys.shape == (41,) and xs.dtype == np.float32
    np.testing.assert_array_equal(ys, target)
    w, res, *_ = np.linalg.lstsq(xs.astype(np.float64), ys.astype(np.float64), rcond=None)
    np.testing.assert_allclose(xs @ w, ys, atol=1e-4)  # ys is exactly linear in xs
    if sparsity:
        assert (np.abs(w) > 1e-3).sum() == sparsity


def test_least_squares_baseline_reaches_zero_after_d_points():
    xs = np.stack([icl_sample(np.random.default_rng(i), dim=5, n_points=9)[0][0] for i in range(4)])
    ys = np.stack([icl_sample(np.random.default_rng(i), dim=5, n_points=9)[0][1] for i in range(4)])
    err = least_squares_baseline(xs, ys)
    assert err.shape == (9,) and err[0] > 0.5 and err[6:].max() < 1e-6
