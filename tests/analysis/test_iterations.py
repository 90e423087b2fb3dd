"""Parameter-free iterations (AoT eq 3, CBSA eq 12) and the explicit softmax / CSP reference layers."""

import math

import pytest
import torch

from attnzoo.analysis import iterations as it
from attnzoo.analysis import measures as M
from attnzoo.analysis.synthetic import orthonormal_bases, subspace_mixture


def _aot_step_loop(z, u, eta, phi, tau):
    """AoT eq 3 literally, in the paper's column layout Z ∈ R^{d×N}, one column at a time."""
    zc = z.T
    out = zc.clone()
    for k in range(u.shape[0]):
        proj = u[k] @ u[k].T @ zc  # U_k U_kᵀ Z
        m = zc.T @ u[k] @ u[k].T @ zc
        for i in range(zc.shape[1]):
            col = torch.softmax(m[:, i], 0)
            if phi == "threshold":
                col = tau * (col > tau).double()
            out[:, i] += eta * proj @ col
    return out.T


@pytest.mark.parametrize("phi", ["softmax", "threshold"])
def test_aot_step_matches_columnwise_definition(phi):
    g = torch.Generator().manual_seed(0)
    z, _, u = subspace_mixture(3, 4, 5, delta=0.3, generator=g)
    got = it.aot_denoise_step(z, u, eta=0.7, phi=phi, tau=0.6)
    torch.testing.assert_close(got, _aot_step_loop(z, u, 0.7, phi, 0.6))


def test_aot_threshold_scales_signal_exactly_under_theorem_conditions():
    """Theorem 1's mechanism: φ(M_k) = BlkDiag(τI, 0, ...), so each token's own-subspace part is scaled
    by exactly 1 + ητ and the rest is untouched (eq 35)."""
    g = torch.Generator().manual_seed(1)
    z, labels, u = subspace_mixture(3, 40, 20, delta=0.02, generator=g)
    z1 = it.aot_denoise_step(z, u, eta=0.4, phi="threshold", tau=0.8)
    own = torch.einsum("nd,nde->ne", z, u[labels] @ u[labels].transpose(1, 2))
    torch.testing.assert_close(z1, z + 0.4 * 0.8 * own)
    ratio = M.subspace_snr(z1, u, labels) / M.subspace_snr(z, u, labels)
    torch.testing.assert_close(ratio, torch.full((3,), 1.32, dtype=torch.float64))


def test_cbsa_linear_step_equals_closed_form():
    """L(I + Σ²/ε²)⁻¹Lᵀ = ε²(ε²I + U_kᵀZᵀZU_k)⁻¹ when L holds all p principal directions (eq 12)."""
    g = torch.Generator().manual_seed(2)
    u = orthonormal_bases(2, 7, 3, generator=g)
    for n in (1, 2, 9):  # N < p too: zero singular values keep f = 1
        z = torch.randn(n, 7, generator=g, dtype=torch.float64)
        eps, kappa = 0.3, 0.4
        expected = z.clone()
        for k in range(2):
            p = z @ u[k]
            inv = torch.linalg.inv(eps**2 * torch.eye(3, dtype=torch.float64) + p.T @ p)
            expected -= kappa * eps**2 * p @ inv @ u[k].T
        torch.testing.assert_close(it.cbsa_linear_step(z, u, eps=eps, kappa=kappa), expected)


def test_cbsa_linear_step_keeps_principal_and_shrinks_weak_directions():
    z = torch.diag(torch.tensor([10.0, 0.01], dtype=torch.float64))  # strong x-direction, weak y
    eye = torch.eye(2, dtype=torch.float64)[None]
    z1 = it.cbsa_linear_step(z, eye, eps=0.1, kappa=0.5)
    assert z1[0, 0].item() == pytest.approx(10.0 * (1 - 0.5 * 0.01 / (0.01 + 100)))
    assert z1[1, 1].item() == pytest.approx(0.01 * (1 - 0.5 * 0.01 / (0.01 + 1e-4)))


def test_softmax_reference_matches_explicit_heads():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    wq, wk, wv = (torch.randn(8, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = it.softmax_attention_reference(x, wq, wk, wv, heads=2)
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        a = torch.softmax((x @ wq[:, sl]) @ (x @ wk[:, sl]).T / 2.0, -1)
        torch.testing.assert_close(out[:, sl], a @ (x @ wv[:, sl]))


@pytest.mark.parametrize("n,group", [(7, 2), (8, 3), (1, 2)])
def test_csp_reference_permutes_each_channel(n, group):
    """Every output channel is a permutation of its value channel (doubly stochastic P_c), channel 0 is
    untouched, and within each group channel c follows channel 0's ranks."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    w = torch.randn(4, 4, generator=g, dtype=torch.float64)
    v = x @ w
    out = it.csp_reference(x, w, group_size=group)
    torch.testing.assert_close(out[:, 0], v[:, 0])
    for c in range(4):
        torch.testing.assert_close(torch.sort(out[:, c]).values, torch.sort(v[:, c]).values)
    for start in range(0, n, group):
        blk = out[start : start + group]
        ref_order = torch.argsort(blk[:, 0])
        for c in range(1, 4):
            assert (torch.diff(blk[ref_order, c]) >= 0).all()
    # CSP proof, eq 12: permutations keep each column's residual, so ‖ε(·)‖_1 (max column sum) is unchanged
    col_abs = lambda t: M.rank1_residual(t).abs().sum(0)  # noqa: E731
    torch.testing.assert_close(col_abs(out), col_abs(v))


def test_iteration_errors():
    z = torch.randn(4, 6)
    u = torch.randn(2, 6, 3)
    with pytest.raises(ValueError, match="phi='relu' is not supported"):
        it.aot_denoise_step(z, u, phi="relu")
    with pytest.raises(ValueError, match=r"tau must lie in \(0, 1\]"):
        it.aot_denoise_step(z, u, tau=1.5)
    with pytest.raises(ValueError, match=r"U must have shape \(K, d=6, p\)"):
        it.cbsa_linear_step(z, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="kappa must be a positive"):
        it.cbsa_linear_step(z, u, kappa=-1.0)
    with pytest.raises(ValueError, match="divisible by heads=4"):
        it.softmax_attention_reference(z, *(torch.randn(6, 6) for _ in range(3)), heads=4)
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        it.aot_denoise(z, u, 0)
    assert math.isfinite(float(it.aot_denoise(z.double(), u.double(), 2)[-1].sum()))
