"""Measures against closed forms on constructed inputs."""

import math

import numpy as np
import pytest
import torch

from attnzoo.analysis import measures as M
from attnzoo.analysis.synthetic import noisy_lines, orthonormal_bases, subspace_mixture


def _orthonormal(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(max(n, d), max(n, d), generator=g, dtype=torch.float64))
    return q[:n, :d]


@pytest.mark.parametrize("d,eps", [(4, 0.5), (7, 1.0), (16, 0.1)])
def test_coding_rate_of_orthonormal_set(d, eps):
    z = _orthonormal(d, d, seed=d)  # N = d orthonormal tokens: ZᵀZ = I
    expected = d / 2 * math.log(1 + 1 / eps**2)
    assert M.coding_rate(z, eps).item() == pytest.approx(expected, rel=1e-12)


def test_coding_rate_matches_definition_both_gram_sides_and_batches():
    g = torch.Generator().manual_seed(1)
    for n, d in [(5, 9), (9, 5), (1, 3)]:
        z = torch.randn(3, n, d, generator=g, dtype=torch.float64)
        eye = torch.eye(n, dtype=torch.float64)
        direct = torch.stack([0.5 * torch.logdet(eye + d / (n * 0.25) * zi @ zi.T) for zi in z])  # eq 1 with ZᵀZ (N×N)
        torch.testing.assert_close(M.coding_rate(z, 0.5), direct, rtol=1e-10, atol=1e-12)
    assert M.coding_rate(torch.zeros(4, 3), 0.5).item() == 0.0
    # float32 input: computed in float64, same value
    z = torch.randn(6, 4, generator=g)
    assert M.coding_rate(z).item() == pytest.approx(M.coding_rate(z.double()).item(), rel=1e-6)


def test_compression_term_is_sum_of_projected_rates():
    g = torch.Generator().manual_seed(2)
    u = orthonormal_bases(3, 12, 4, generator=g)
    z = torch.randn(10, 12, generator=g, dtype=torch.float64)
    expected = sum(M.coding_rate(z @ u[k], 0.5) for k in range(3))
    assert M.compression_term(z, u).item() == pytest.approx(expected.item(), rel=1e-12)
    # tokens lying in subspace 0 only: the other subspaces see zeros and contribute 0
    z0 = torch.randn(10, 4, generator=g, dtype=torch.float64) @ u[0].T
    assert M.compression_term(z0, u).item() == pytest.approx(M.coding_rate(z0 @ u[0]).item(), rel=1e-12)
    # normalised variant is invariant to per-token scaling
    scale = torch.rand(10, 1, generator=g, dtype=torch.float64) * 5 + 0.1
    assert M.compression_term(z * scale, u, normalize=True).item() == pytest.approx(
        M.compression_term(z, u, normalize=True).item(), rel=1e-10
    )


def _crate_rate_numpy(z, u, eps_sq, normalize):
    """CRATE's measured compression term written out in numpy/float64, one head and one batch element at a time."""
    z, u = np.asarray(z, dtype=np.float64), np.asarray(u, dtype=np.float64)
    out = np.zeros(z.shape[:-2])
    for idx in np.ndindex(*z.shape[:-2]):
        total = 0.0
        for k in range(u.shape[0]):
            w = z[idx] @ u[k]  # (N, p): row j is (U_kᵀ z_j)ᵀ
            if normalize:
                w = w / np.linalg.norm(w, axis=1, keepdims=True)
            n, p = w.shape
            sign, logdet = np.linalg.slogdet(np.eye(n) + p / (n * eps_sq) * (w @ w.T))  # N×N as in CRATE's code
            assert sign > 0
            total += 0.5 * logdet
        out[idx] = total
    return out


@pytest.mark.parametrize("shape,k,p", [((7, 6), 2, 3), ((2, 5, 8), 4, 2), ((3, 2, 11, 4), 1, 4), ((9, 12), 3, 4)])
def test_crate_compression_term_matches_numpy_definition(shape, k, p):
    g = torch.Generator().manual_seed(sum(shape) + k)
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * 3.0
    u = torch.randn(k, shape[-1], p, generator=g, dtype=torch.float64)  # learned bases need not be orthonormal
    got = M.crate_compression_term(z, u)  # defaults: CRATE's eps² = 0.01, per-head unit-norm codes
    np.testing.assert_allclose(got.numpy(), _crate_rate_numpy(z, u, 0.01, True), rtol=1e-10, atol=1e-10)
    # normalisation off: the raw eq 2 at the same eps, both here and in the numpy definition
    raw = M.crate_compression_term(z, u, 0.5, normalize=False)
    torch.testing.assert_close(raw, M.compression_term(z, u, 0.5), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(raw.numpy(), _crate_rate_numpy(z, u, 0.25, False), rtol=1e-10, atol=1e-10)
    # float32 tokens are measured in float64
    assert M.crate_compression_term(z.float(), u.float()).dtype == torch.float64


def test_crate_compression_term_depends_only_on_code_directions_and_is_bounded():
    g = torch.Generator().manual_seed(5)
    u = orthonormal_bases(3, 12, 4, generator=g)
    z = torch.randn(20, 12, generator=g, dtype=torch.float64)
    base = M.crate_compression_term(z, u).item()
    # per-token scaling changes the raw term but not CRATE's (codes are normalised per head)
    scale = torch.rand(20, 1, generator=g, dtype=torch.float64) * 10 + 0.1
    assert M.crate_compression_term(z * scale, u).item() == pytest.approx(base, rel=1e-10)
    assert M.compression_term(z * scale, u).item() != pytest.approx(M.compression_term(z, u).item(), rel=1e-3)
    # it differs from normalising the ambient token before projecting (the other 'normalised' variant)
    assert base != pytest.approx(M.compression_term(z, u, 0.1, normalize=True).item(), rel=1e-3)
    # each head contributes at most ½ p log(1 + 1/ε²) (N >= p); all tokens on one direction per head: rank 1
    assert 0 < base <= 3 * 0.5 * 4 * math.log(1 + 1 / 0.01) + 1e-9
    line = torch.randn(20, 1, generator=g, dtype=torch.float64) @ torch.randn(1, 12, generator=g, dtype=torch.float64)
    per_head_rank1 = 0.5 * math.log(1 + 4 / (20 * 0.01) * 20)  # N identical unit codes: one eigenvalue N
    assert M.crate_compression_term(line, u).item() == pytest.approx(3 * per_head_rank1, rel=1e-9)
    with pytest.raises(ValueError, match="eps must be a positive"):
        M.crate_compression_term(z, u, eps=-0.1)
    with pytest.raises(ValueError, match="ambient dimension 12 but the tokens have d=5"):
        M.crate_compression_term(torch.randn(4, 5), u)


def test_partition_compression_with_hard_labels_is_weighted_group_rates():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(12, 5, generator=g, dtype=torch.float64)
    labels = torch.tensor([0] * 4 + [1] * 8)
    pi = torch.nn.functional.one_hot(labels, 3).double()  # group 2 empty
    eps, n, d = 0.5, 12, 5
    expected = 0.0
    for k, nk in ((0, 4), (1, 8)):
        zk = z[labels == k]
        expected += 0.5 * nk / n * torch.logdet(torch.eye(d, dtype=torch.float64) + d / (eps**2 * nk) * zk.T @ zk)
    assert M.partition_compression(z, pi, eps).item() == pytest.approx(expected.item(), rel=1e-12)


def test_variational_equals_compression_when_u_diagonalises_and_upper_bounds_otherwise():
    """ToST Theorem 1 / Corollary 1: R^var_c >= R_c, with equality for U_k diagonalising Z Diag(π_k) Zᵀ."""
    g = torch.Generator().manual_seed(4)
    n, d, k = 20, 6, 3
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    pi = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64), -1)
    eigvecs = torch.stack([torch.linalg.eigh(z.T @ torch.diag(pi[:, j]) @ z).eigenvectors for j in range(k)])
    r_c = M.partition_compression(z, pi, 0.5).item()
    assert M.variational_compression(z, pi, eigvecs, 0.5).item() == pytest.approx(r_c, rel=1e-10)
    for seed in range(3):
        q = orthonormal_bases(1, d, d, generator=torch.Generator().manual_seed(seed))[0]
        u = q.expand(k, d, d)
        assert M.variational_compression(z, pi, u, 0.5).item() > r_c + 1e-6


def test_variational_compression_normalize_and_batch():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(2, 8, 6, generator=g, dtype=torch.float64)
    pi = torch.softmax(torch.randn(2, 8, 2, generator=g, dtype=torch.float64), -1)
    u = orthonormal_bases(2, 6, 3, generator=g)
    batched = M.variational_compression(z, pi, u)
    assert batched.shape == (2,)
    assert batched[1].item() == pytest.approx(M.variational_compression(z[1], pi[1], u).item(), rel=1e-12)
    scaled = z * torch.rand(2, 8, 1, generator=g, dtype=torch.float64).add(0.5)
    torch.testing.assert_close(
        M.variational_compression(scaled, pi, u, normalize=True), M.variational_compression(z, pi, u, normalize=True)
    )


def test_snr_noise_free_is_infinite_and_matches_definition_1_level():
    g = torch.Generator().manual_seed(6)
    z, labels, u = subspace_mixture(3, 8, 40, delta=0.0, generator=g)
    # noise-free: infinite up to round-off of the projection (≈ 1/machine-epsilon)
    assert (M.subspace_snr(z, u, labels) > 1e13).all()
    # tiny noise: huge but finite
    z, labels, u = subspace_mixture(3, 8, 40, delta=1e-9, generator=torch.Generator().manual_seed(6))
    snr = M.subspace_snr(z, u, labels)
    assert torch.isfinite(snr).all() and (snr > 1e7).all()
    # SNR ≈ ||A_k|| / ||noise|| ≈ 1/(δ sqrt(K-1)) for Definition 1 data
    z, labels, u = subspace_mixture(3, 16, 400, delta=0.2, generator=torch.Generator().manual_seed(7))
    snr = M.subspace_snr(z, u, labels)
    torch.testing.assert_close(snr, torch.full((3,), 1 / (0.2 * math.sqrt(2)), dtype=torch.float64), rtol=0.05, atol=0)


def test_snr_explicit_values():
    u = torch.stack([torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0], [1.0]])]).double()
    z = torch.tensor([[3.0, 4.0], [0.0, 2.0]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    snr = M.subspace_snr(z, u, labels)
    assert snr[0].item() == pytest.approx(3 / 4)
    assert math.isinf(snr[1].item())


def test_rank1_residual_of_collapsed_matrix_is_zero():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 7, generator=g, dtype=torch.float64).expand(9, 7)  # X = 1 xᵀ
    for center in ("mean", "median"):
        assert M.rank_collapse_residual(x, center=center).item() == pytest.approx(0.0, abs=1e-14)
    # a rank-1 u vᵀ with non-constant u has NOT collapsed to identical tokens
    uv = torch.arange(1.0, 10.0, dtype=torch.float64)[:, None] * torch.randn(1, 7, generator=g, dtype=torch.float64)
    assert M.rank_collapse_residual(uv).item() > 1.0


def test_norm_1_inf_closed_form():
    x = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], dtype=torch.float64)
    # max column abs-sum = 9, max row abs-sum = 15
    assert M.norm_1_inf(x).item() == pytest.approx(math.sqrt(9 * 15))
    resid = M.rank1_residual(x)
    torch.testing.assert_close(resid, x - x.mean(0, keepdim=True))
    assert M.rank_collapse_residual(x, relative=True).item() == pytest.approx(
        M.norm_1_inf(resid).item() / math.sqrt(135)
    )


def test_singular_spectrum_and_gram():
    x = torch.diag(torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(M.singular_spectrum(x), torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64))
    torch.testing.assert_close(
        M.singular_spectrum(x, normalize=False), torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)
    )
    u = orthonormal_bases(3, 12, 4, generator=torch.Generator().manual_seed(9)) * 3.0  # scaled: normalised away
    torch.testing.assert_close(M.subspace_gram(u), torch.eye(12, dtype=torch.float64), atol=1e-12, rtol=0)
    sub = M.subspace_gram(u, directions=2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sub, torch.eye(6, dtype=torch.float64), atol=1e-12, rtol=0)
    same = torch.ones(2, 5, 1, dtype=torch.float64)  # two identical 1-d subspaces: cosine 1
    torch.testing.assert_close(M.subspace_gram(same), torch.ones(2, 2, dtype=torch.float64))


def test_noisy_lines_shapes():
    z, labels, dirs = noisy_lines(4, 6, noise=0.0, generator=torch.Generator().manual_seed(0))
    assert z.shape == (4, 6, 3) and labels.shape == (24,) and dirs.shape == (4, 3)
    # noise-free: every class is exactly on its line (rank 1)
    assert (torch.linalg.svdvals(z)[:, 1] < 1e-12).all()


def test_bad_inputs_raise_clear_errors():
    z = torch.randn(5, 4)
    with pytest.raises(ValueError, match="eps must be a positive"):
        M.coding_rate(z, eps=0.0)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., N, d\)"):
        M.coding_rate(torch.randn(4))
    with pytest.raises(TypeError, match="floating-point"):
        M.coding_rate(torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="ambient dimension 3 but the tokens have d=4"):
        M.compression_term(z, torch.randn(2, 3, 2))
    with pytest.raises(ValueError, match="Pi has 4 rows but Z has N=5"):
        M.partition_compression(z, torch.rand(4, 2))
    with pytest.raises(ValueError, match="non-negative"):
        M.partition_compression(z, -torch.rand(5, 2))
    with pytest.raises(ValueError, match="K=3 groups but U has 2"):
        M.variational_compression(z, torch.rand(5, 3), torch.randn(2, 4, 2))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\]"):
        M.subspace_snr(z, torch.randn(2, 4, 2), torch.tensor([0, 1, 2, 0, 1]))
    with pytest.raises(ValueError, match="center='max' is not supported"):
        M.rank1_residual(z, center="max")
    with pytest.raises(ValueError, match=r"directions must be an integer in \[1, p=2\]"):
        M.subspace_gram(torch.randn(2, 4, 2), directions=3)
    with pytest.raises(ValueError, match="do not fit in d=5"):
        orthonormal_bases(2, 5, 3)
    with pytest.raises(ValueError, match="delta must be a non-negative"):
        subspace_mixture(2, 2, 3, delta=-1.0)
