"""CBSA op: fast vs naive, white-box identities (eqs 4-9, 12, 13), pooling helpers, errors."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_half_close
from torch.utils._python_dispatch import TorchDispatchMode

from attnzoo.ops.cbsa import cbsa, pool_reps, pool_reps_1d, pool_reps_2d

# (variant, contraction) pairs the op accepts
CASES = [
    ("cbsa", "softmax"),
    ("cbsa", "exact"),
    ("agent", None),
    ("mssa", "softmax"),
    ("mssa", "exact"),
    ("linear", None),
    ("channel", None),
]


def _needs_reps(variant: str) -> bool:
    return variant in ("cbsa", "agent")


def _inputs(shape, dtype=torch.float64, requires_grad=False):
    b, h, n, p, m = shape
    w = torch.randn(b, h, n, p, dtype=dtype)
    reps = torch.randn(b, h, m, p, dtype=dtype)
    eta = torch.randn(h, 1, 1, dtype=dtype)
    for t in (w, reps, eta):
        t.requires_grad_(requires_grad)
    return w, reps, eta


def _run(variant, contraction, w, reps, eta, backend, **kw):
    return cbsa(
        w,
        reps if _needs_reps(variant) else None,
        variant=variant,
        contraction=contraction,
        eta=eta,
        backend=backend,
        **kw,
    )


# --------------------------------------------------------------------------------------------------
# fast vs naive
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant,contraction", CASES)
@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_gradcheck(variant, contraction, backend):
    w, reps, eta = _inputs((1, 2, 5, 3, 2), requires_grad=True)
    if _needs_reps(variant):
        fn = lambda w, r, e: cbsa(w, r, variant=variant, contraction=contraction, eta=e, eps=0.9, backend=backend)  # noqa: E731
        args = (w, reps, eta)
    else:
        fn = lambda w: cbsa(w, variant=variant, contraction=contraction, eps=0.9, backend=backend)  # noqa: E731
        args = (w,)
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-6)


def test_gradcheck_exact_more_reps_than_channels():
    """M > P: the fast path solves the push-through system (I_P + a R^T R) instead of (I_M + a R R^T)."""
    w, reps, eta = _inputs((1, 1, 4, 2, 3), requires_grad=True)
    fn = lambda w, r, e: cbsa(w, r, contraction="exact", eta=e, eps=0.9, backend="torch")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (w, reps, eta), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant,contraction", [("cbsa", "softmax"), ("cbsa", "exact"), ("linear", None)])
def test_half_inputs_computed_in_float32(dtype, variant, contraction):
    w, reps, eta = _inputs((2, 2, 12, 8, 4), torch.float32)
    w, reps = w.to(dtype), reps.to(dtype)
    out = _run(variant, contraction, w, reps, 0.5, "torch")
    ref = _run(variant, contraction, w.float(), reps.float(), 0.5, "naive")
    assert out.dtype == dtype
    assert_half_close(out, ref)


class _ShapeRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.numels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numels.append((t.numel(), str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("variant,contraction", [c for c in CASES if c != ("mssa", "softmax")])
def test_fast_path_is_linear_in_n(variant, contraction):
    """No forward or backward intermediate of the fast path grows like N^2 (O(N M P) memory)."""
    b, h, n, p, m = 1, 2, 96, 4, 3
    w, reps, eta = _inputs((b, h, n, p, m), requires_grad=True)
    rec = _ShapeRecorder()
    with rec:
        out = _run(variant, contraction, w, reps, eta, "torch")
        out.sum().backward()
    biggest = max(rec.numels)
    assert biggest[0] <= b * h * n * max(m, p), f"intermediate {biggest} is not O(N M P)"
    # the recorder does see N x N intermediates when they exist (the naive exact MSSA)
    rec = _ShapeRecorder()
    with rec:
        cbsa(w.detach(), variant="mssa", contraction="exact", backend="naive")
    assert max(rec.numels)[0] >= n * n


# --------------------------------------------------------------------------------------------------
# white-box identities
# --------------------------------------------------------------------------------------------------
def _coding_rate(X: torch.Tensor, a: float) -> torch.Tensor:
    """sum over (B, H) of R = 1/2 logdet(I_m + a X X^T) for row-stacked X (..., m, P) (eq 1, per subspace)."""
    m = X.shape[-2]
    eye = torch.eye(m, dtype=X.dtype)
    return 0.5 * torch.logdet(eye + a * X @ X.transpose(-1, -2)).sum()


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("m", [3, 6])
def test_exact_contraction_is_gradient_wrt_representatives(backend, m):
    """eq 7: Contraction = U_k^T Q (I + a Q^T Q)^{-1} = (1/a) grad_{U_k^T Q} R(U_k^T Q), a = p/(m eps^2)."""
    b, h, n, p, eps = 2, 2, 11, 4, 0.8
    w, reps, _ = _inputs((b, h, n, p, m))
    _, internals = cbsa(w, reps, contraction="exact", eps=eps, eta=0.6, return_internals=True, backend=backend)
    a = p / (m * eps**2)
    R = internals["reps"].clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_coding_rate(R, a), R)
    torch.testing.assert_close(internals["contracted"], grad / a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("eta", [1.0, -0.35])
def test_exact_cbsa_is_gradient_of_compression_term_wrt_tokens(backend, eta):
    """Identity 2 (eq 6/7): with A_k held fixed and U_k^T Q = sg(U_k^T Q_ini) + eta U_k^T Z A_k (eq 5),

        grad_Z R_c(Q | U_[K]) = eta * p/(m eps^2) * sum_k U_k CBSA_k,
        R_c = sum_k 1/2 logdet(I_m + p/(m eps^2) Q_k^T Q_k),

    i.e. the exact CBSA output is the gradient of the compression term of (4) w.r.t. the tokens Z (through
    Q = Z A), up to the constant p/(m eps^2) (times eta, the extraction step mapping Z to Q).
    """
    bsz, n, heads, p, eps = 2, 13, 3, 4, 1.1
    d = heads * p
    U, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))  # orthonormal: U_k = U[:, k p:(k+1) p]
    Z = torch.randn(bsz, n, d, dtype=torch.float64)

    def per_head(Z):  # w_k = (U_k^T Z)^T, (B, K, N, p)
        return torch.einsum("bnd,dkp->bknp", Z, U.reshape(d, heads, p))

    w = per_head(Z)
    reps_init = pool_reps(w, num_reps=5).detach()  # sg(avgpool(U_k^T Z)) of eq 5
    m = reps_init.shape[-2]
    out, internals = cbsa(w, reps_init, contraction="exact", eps=eps, eta=eta, return_internals=True, backend=backend)
    a = p / (m * eps**2)
    A_T = internals["attn_extract"]  # (B, K, m, N), held fixed

    Zl = Z.clone().requires_grad_(True)
    Q = reps_init + eta * A_T @ per_head(Zl)
    torch.testing.assert_close(Q.detach(), internals["reps"], rtol=1e-12, atol=1e-12)
    (grad_Z,) = torch.autograd.grad(_coding_rate(Q, a), Zl)
    lifted = torch.einsum("bknp,dkp->bnd", out, U.reshape(d, heads, p))  # sum_k U_k CBSA_k
    torch.testing.assert_close(grad_Z, eta * a * lifted, rtol=1e-10, atol=1e-12)

    # "A_k held fixed" matters: differentiating through A_k = softmax(.) too gives a different vector field
    Zl = Z.clone().requires_grad_(True)
    wl = per_head(Zl)
    A_T_live = torch.softmax(reps_init @ wl.transpose(-1, -2) * p**-0.5, dim=-1)
    (grad_full,) = torch.autograd.grad(_coding_rate(reps_init + eta * A_T_live @ wl, a), Zl)
    assert (grad_full - grad_Z).abs().max() > 1e-4


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_exact_mssa_is_gradient_of_token_coding_rate(backend):
    """§3.3 with Q = Z, A = I, m = N: exact MSSA = (1/a) grad_Z R(U_k^T Z), a = p/(N eps^2)."""
    b, h, n, p, eps = 2, 2, 9, 5, 0.9
    w = torch.randn(b, h, n, p, dtype=torch.float64, requires_grad=True)
    out = cbsa(w.detach(), variant="mssa", contraction="exact", eps=eps, backend=backend)
    a = p / (n * eps**2)
    (grad,) = torch.autograd.grad(_coding_rate(w, a), w)
    torch.testing.assert_close(out, grad / a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_linear_variant_is_covariance_gradient(backend):
    """eq 12: w F(w^T w) with f = eps^2/(eps^2 + lambda) is eps^2 grad_w 1/2 logdet(I_P + w^T w / eps^2)."""
    b, h, n, p, eps = 2, 2, 10, 4, 1.4
    w = torch.randn(b, h, n, p, dtype=torch.float64, requires_grad=True)
    out = cbsa(w.detach(), variant="linear", eps=eps, backend=backend)
    rate = 0.5 * torch.logdet(torch.eye(p, dtype=w.dtype) + w.transpose(-1, -2) @ w / eps**2).sum()
    (grad,) = torch.autograd.grad(rate, w)
    torch.testing.assert_close(out, eps**2 * grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_linear_variant_spectral_filter(backend):
    """eq 12: principal directions with variance lambda are scaled by eps^2/(eps^2 + lambda)."""
    n, p, eps = 12, 3, 0.5
    R, _ = torch.linalg.qr(torch.randn(n, p, dtype=torch.float64))  # orthonormal token coefficients
    L, _ = torch.linalg.qr(torch.randn(p, p, dtype=torch.float64))  # principal directions
    s = torch.tensor([3.0, 1.0, 0.2], dtype=torch.float64)
    w = (R * s) @ L.T  # SVD w = R diag(s) L^T
    out = cbsa(w[None, None], variant="linear", eps=eps, backend=backend)[0, 0]
    expected = (R * (s * eps**2 / (eps**2 + s**2))) @ L.T
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_channel_variant_equals_linear_when_axes_are_principal(backend):
    """eq 13 is eq 12 with L_k = I: they agree exactly when w^T w is diagonal (orthogonal channels)."""
    n, p, eps = 10, 4, 0.7
    R, _ = torch.linalg.qr(torch.randn(n, p, dtype=torch.float64))
    w = (R * torch.tensor([2.0, 0.5, 1.0, 3.0], dtype=torch.float64))[None, None]
    ch = cbsa(w, variant="channel", eps=eps, backend=backend)
    lin = cbsa(w, variant="linear", eps=eps, backend=backend)
    torch.testing.assert_close(ch, lin, rtol=1e-10, atol=1e-12)
    # and differ for generic (correlated) channels
    w2 = torch.randn(1, 1, n, p, dtype=torch.float64)
    gap = cbsa(w2, variant="channel", backend=backend) - cbsa(w2, variant="linear", backend=backend)
    assert gap.abs().max() > 1e-3
    # explicit eq 13
    expected = w2 * (eps**2 / (eps**2 + (w2**2).sum(-2, keepdim=True)))
    torch.testing.assert_close(cbsa(w2, variant="channel", eps=eps, backend=backend), expected)


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("n", [1, 6, 11])
def test_tokens_as_own_representatives_reduce_to_mssa(backend, n):
    """§3.3, eq 9: Q = Z, A_k = I -> CBSA (8) is MSSA: softmax(w w^T * scale) w."""
    from attnzoo.ops.mssa import mssa  # attnzoo.ops.mssa: the MSSA op (AoT eq 3 / CRATE)

    w = torch.randn(2, 3, n, 4, dtype=torch.float64)
    scale = 0.37
    out = cbsa(w, variant="mssa", scale=scale, backend=backend)
    explicit = torch.softmax(w @ w.transpose(-1, -2) * scale, dim=-1) @ w
    torch.testing.assert_close(out, explicit, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, mssa(w, causal=False, scale=scale, normalize_query=False), rtol=1e-10, atol=1e-12)
    # default scale is P ** -0.5 in both
    torch.testing.assert_close(cbsa(w, variant="mssa", backend=backend), mssa(w), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("contraction", ["softmax", "exact"])
def test_cbsa_explicit_formula(backend, contraction):
    """Eqs 5, 7/8 written out on one head in row layout."""
    n, p, m, eps, eta, scale = 7, 3, 4, 0.6, 0.8, 0.45
    w = torch.randn(1, 1, n, p, dtype=torch.float64)
    reps = torch.randn(1, 1, m, p, dtype=torch.float64)
    W, Q0 = w[0, 0], reps[0, 0]
    A_T = torch.softmax(Q0 @ W.T * scale, dim=1)  # each representative: a distribution over tokens
    Q = Q0 + eta * A_T @ W
    if contraction == "softmax":
        C = torch.softmax(Q @ Q.T * scale, dim=1) @ Q
    else:
        C = torch.linalg.solve(torch.eye(m, dtype=w.dtype) + p / (m * eps**2) * Q @ Q.T, Q)
    expected = A_T.T @ C
    out = cbsa(w, reps, contraction=contraction, eps=eps, eta=eta, scale=scale, backend=backend)
    torch.testing.assert_close(out[0, 0], expected, rtol=1e-12, atol=1e-12)
    agent = cbsa(w, reps, variant="agent", eta=eta, scale=scale, backend=backend)
    torch.testing.assert_close(agent[0, 0], A_T.T @ Q, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# token permutations
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant,contraction", CASES)
@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_equivariant_with_fixed_representatives(variant, contraction, backend):
    """For fixed reps every step (softmax over tokens, sums over tokens, per-token broadcast) is equivariant."""
    w, reps, _ = _inputs((2, 2, 9, 4, 3))
    perm = torch.randperm(9)
    out = _run(variant, contraction, w, reps, 0.7, backend)
    out_p = _run(variant, contraction, w[:, :, perm], reps, 0.7, backend)
    torch.testing.assert_close(out_p, out[:, :, perm], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("contraction", ["softmax", "exact"])
def test_pooled_cbsa_is_not_permutation_equivariant(contraction):
    """1-D pooling averages contiguous windows, so a generic permutation changes the representatives."""
    n, num_prefix = 13, 1
    w = torch.randn(1, 2, n, 4, dtype=torch.float64)

    def f(w):
        return cbsa(w, pool_reps(w, num_reps=3, num_prefix_tokens=num_prefix), contraction=contraction)

    out = f(w)
    perm = torch.cat([torch.arange(num_prefix), num_prefix + torch.tensor([4, 1, 9, 0, 7, 2, 10, 5, 3, 11, 8, 6])])
    assert (f(w[:, :, perm]) - out[:, :, perm]).abs().max() > 1e-3
    # ... but permuting within each pooling window ([1,5), [5,9), [9,13)) or among prefix tokens is harmless
    within = torch.tensor([0, 3, 1, 4, 2, 8, 7, 5, 6, 11, 12, 9, 10])
    torch.testing.assert_close(f(w[:, :, within]), out[:, :, within], rtol=1e-10, atol=1e-12)
    w2 = torch.randn(1, 2, n, 4, dtype=torch.float64)

    def g(w):
        return cbsa(w, pool_reps(w, num_reps=5, num_prefix_tokens=3), contraction=contraction)

    pre = torch.cat([torch.tensor([2, 0, 1]), torch.arange(3, n)])
    torch.testing.assert_close(g(w2[:, :, pre]), g(w2)[:, :, pre], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------------
def _adaptive_windows(length: int, out: int):
    return [(math.floor(i * length / out), math.ceil((i + 1) * length / out)) for i in range(out)]


@pytest.mark.parametrize(
    "n,num_prefix,num_reps", [(1, 0, 64), (7, 0, 3), (10, 2, 3), (5, 1, 64), (13, 3, 10), (66, 2, 8), (130, 1, 64)]
)
def test_pool_1d_matches_window_means(n, num_prefix, num_reps):
    w = torch.randn(2, 3, n, 4, dtype=torch.float64)
    reps = pool_reps(w, num_reps=num_reps, num_prefix_tokens=num_prefix)
    body = w[:, :, num_prefix:]
    m = min(num_reps, n - num_prefix)
    assert reps.shape == (2, 3, m, 4)
    expected = torch.stack([body[:, :, s:e].mean(2) for s, e in _adaptive_windows(n - num_prefix, m)], dim=2)
    torch.testing.assert_close(reps, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pool_reps_1d(w, num_reps, num_prefix_tokens=num_prefix), reps)
    # prefix tokens never enter the representatives
    w2 = w.clone()
    w2[:, :, :num_prefix] = 1e3
    torch.testing.assert_close(pool_reps(w2, num_reps=num_reps, num_prefix_tokens=num_prefix), reps)


@pytest.mark.parametrize("length,m", [(64, 8), (65, 8), (7, 3), (1, 1), (100, 64), (5, 5)])
def test_window_means_equal_adaptive_avg_pool_forward_and_backward(length, m):
    # the pooling is written without F.adaptive_avg_pool1d (its CUDA backward fails for long windows): same values
    from attnzoo.ops.cbsa.pooling import window_means

    x = torch.randn(2, 3, length, 4, dtype=torch.float64, requires_grad=True)
    got = window_means(x, m)
    ref = torch.nn.functional.adaptive_avg_pool1d(x.transpose(-1, -2).flatten(0, 1), m).unflatten(0, (2, 3))
    ref = ref.transpose(-1, -2)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(got)
    torch.testing.assert_close(*(torch.autograd.grad(y, x, g)[0] for y in (got, ref)), rtol=1e-12, atol=1e-12)


def test_pool_1d_default_is_64_reps():
    w = torch.randn(1, 1, 200, 2)
    assert pool_reps(w).shape == (1, 1, 64, 2)
    assert pool_reps(w[:, :, :9]).shape == (1, 1, 9, 2)


@pytest.mark.parametrize(
    "grid,rep_grid,num_prefix", [((4, 6), (2, 3), 0), ((5, 7), (2, 3), 1), ((3, 3), (3, 3), 2), ((2, 3), (4, 4), 0)]
)
def test_pool_2d_matches_window_means(grid, rep_grid, num_prefix):
    gh, gw = grid
    w = torch.randn(2, 2, num_prefix + gh * gw, 3, dtype=torch.float64)
    reps = pool_reps(w, grid=grid, rep_grid=rep_grid, num_prefix_tokens=num_prefix)
    assert reps.shape == (2, 2, rep_grid[0] * rep_grid[1], 3)
    img = w[:, :, num_prefix:].reshape(2, 2, gh, gw, 3)  # row-major token grid
    expected = torch.stack(
        [
            img[:, :, ys:ye, xs:xe].mean((2, 3))
            for ys, ye in _adaptive_windows(gh, rep_grid[0])
            for xs, xe in _adaptive_windows(gw, rep_grid[1])
        ],
        dim=2,
    )
    torch.testing.assert_close(reps, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pool_reps_2d(w, grid, rep_grid, num_prefix_tokens=num_prefix), reps)
    w2 = w.clone()
    w2[:, :, :num_prefix] = -7.0
    torch.testing.assert_close(pool_reps(w2, grid=grid, rep_grid=rep_grid, num_prefix_tokens=num_prefix), reps)


def test_pool_2d_default_rep_grid():
    assert pool_reps(torch.randn(1, 1, 1 + 14 * 14, 2), grid=(14, 14), num_prefix_tokens=1).shape == (1, 1, 64, 2)
    assert pool_reps(torch.randn(1, 1, 3 * 20, 2), grid=(3, 20)).shape == (1, 1, 3 * 8, 2)


def test_pool_errors():
    w = torch.randn(1, 2, 17, 4)
    with pytest.raises(ValueError, match=r"grid=\(4, 5\) holds 20 tokens but the input has 16 non-prefix tokens"):
        pool_reps(w, grid=(4, 5), num_prefix_tokens=1)
    with pytest.raises(ValueError, match=r"grid=\(4, 4\) holds 16 tokens but the input has 17"):
        pool_reps(w, grid=(4, 4))
    with pytest.raises(ValueError, match="grid must be a pair of positive integers"):
        pool_reps(w, grid=(4, 0))
    with pytest.raises(ValueError, match="rep_grid must be a pair of positive integers"):
        pool_reps(w, grid=(4, 4), rep_grid=(2,), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="num_reps=8 applies to 1-D pooling only"):
        pool_reps(w, num_reps=8, grid=(4, 4), num_prefix_tokens=1)
    with pytest.raises(ValueError, match="rep_grid=.* needs a token grid"):
        pool_reps(w, rep_grid=(2, 2))
    with pytest.raises(ValueError, match="no non-prefix tokens to pool: N=17 tokens with num_prefix_tokens=17"):
        pool_reps(w, num_prefix_tokens=17)
    with pytest.raises(ValueError, match="num_prefix_tokens must be a non-negative integer"):
        pool_reps(w, num_prefix_tokens=-1)
    with pytest.raises(ValueError, match="num_reps must be a positive integer"):
        pool_reps(w, num_reps=0)
    with pytest.raises(ValueError, match=r"w must have shape \(B, H, N, P\)"):
        pool_reps(w[0])


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------
def test_op_errors():
    w = torch.randn(1, 2, 5, 4)
    reps = torch.randn(1, 2, 3, 4)
    with pytest.raises(
        ValueError, match=r"contraction='inverse' is not supported; valid choices: \['softmax', 'exact'\]"
    ):
        cbsa(w, reps, contraction="inverse")
    with pytest.raises(ValueError, match=r"variant='nystrom' is not supported; valid choices"):
        cbsa(w, reps, variant="nystrom")
    with pytest.raises(
        ValueError, match=r"backend='cuda' is not supported by cbsa; valid backends: \['auto', 'naive', 'torch'\]"
    ):
        cbsa(w, reps, backend="cuda")
    with pytest.raises(ValueError, match="contraction='exact' cannot be chosen for variant='linear'"):
        cbsa(w, variant="linear", contraction="exact")
    with pytest.raises(ValueError, match="contraction='softmax' cannot be chosen for variant='agent'"):
        cbsa(w, reps, variant="agent", contraction="softmax")
    with pytest.raises(ValueError, match="variant='cbsa' needs reps"):
        cbsa(w)
    with pytest.raises(ValueError, match="variant='mssa' determines its own representatives"):
        cbsa(w, reps, variant="mssa")
    with pytest.raises(ValueError, match=r"reps must have shape \(B, H, M, P\) = \(1, 2, M >= 1, 4\)"):
        cbsa(w, torch.randn(1, 2, 3, 5))
    with pytest.raises(ValueError, match=r"reps must have shape"):
        cbsa(w, torch.randn(1, 2, 0, 4))
    with pytest.raises(TypeError, match="reps dtype torch.float64 differs from w dtype torch.float32"):
        cbsa(w, reps.double())
    with pytest.raises(ValueError, match=r"w must have shape \(B, H, N, P\)"):
        cbsa(w[0], reps)
    with pytest.raises(TypeError, match="w must be a floating-point tensor"):
        cbsa(w.long(), reps)
    with pytest.raises(ValueError, match="w must hold at least one token"):
        cbsa(w[:, :, :0], reps)
    with pytest.raises(ValueError, match="eps must be a positive finite number, got 0.0"):
        cbsa(w, reps, eps=0.0)
    with pytest.raises(ValueError, match="scale must be None or a positive finite number"):
        cbsa(w, reps, scale=-1.0)
    with pytest.raises(ValueError, match=r"eta must be a float or a tensor broadcastable to \(B, H, 1, 1\)"):
        cbsa(w, reps, eta=torch.ones(2))
    with pytest.raises(ValueError, match="eta must be a finite float"):
        cbsa(w, reps, eta=float("nan"))
