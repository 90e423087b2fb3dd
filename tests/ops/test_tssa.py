"""Op-level tests of TSSA (ToST Alg. 1 / 2): fast path vs the literal reference, gradients, causality,
equivariance, recurrent decoding, input errors, and the white-box identity with eq. 4 / eq. 6."""

import pytest
import torch
from conftest import assert_half_close

from attnzoo.ops.tssa import tssa, tssa_init_state, tssa_pi, tssa_step
from attnzoo.ops.tssa.chunk import chunked_cumsum, reverse_chunked_cumsum
from attnzoo.ops.tssa.naive import tssa_naive

# N=1, odd N, and N=300 > the scan chunk (32 at N=300) with a ragged last chunk; N=777 spans several
# chunks (256+) and token blocks (64) of the CPU kernels, ragged, at a head dim they unroll (P=16)
SHAPES = [(1, 1, 1, 1), (2, 3, 1, 4), (2, 3, 7, 5), (1, 4, 33, 3), (2, 2, 300, 6), (1, 3, 777, 16)]
# "cpu" (fused C++ forward) must build here: a failed build fails these tests rather than skipping them
FAST = ["torch", "cpu"]


def _inputs(shape, dtype, causal, *, requires_grad=True, extra_len=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, h, n, p = shape
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    # features of different scales and a temperature far from 1 make Pi far from uniform
    w = w * torch.exp(torch.randn(1, h, 1, p, generator=g, dtype=torch.float64))
    temp = 0.5 + 2 * torch.rand(h, generator=g, dtype=torch.float64)
    bias = 0.3 * torch.randn(h, n + extra_len, 1, generator=g, dtype=torch.float64) if causal else None
    cast = [t.to(dtype).requires_grad_(requires_grad) if t is not None else None for t in (w, temp, bias)]
    return cast


def _out_and_grads(w, temp, bias, causal, backend, seed=1):
    out = tssa(w, temp, causal=causal, bias=bias, backend=backend)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    leaves = [t for t in (w, temp, bias) if t is not None]
    grads = torch.autograd.grad((out * cot).sum(), leaves)
    return out, grads


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-4)])
def test_fast_matches_naive(shape, causal, dtype, tol, backend):
    w, temp, bias = _inputs(shape, dtype, causal)
    out_n, grads_n = _out_and_grads(w, temp, bias, causal, "naive")
    out_f, grads_f = _out_and_grads(w, temp, bias, causal, backend)
    assert out_f.dtype == dtype and out_f.shape == shape
    torch.testing.assert_close(out_f, out_n, rtol=tol, atol=tol)
    for gf, gn in zip(grads_f, grads_n, strict=True):
        scale = gn.abs().max().clamp_min(1.0)
        torch.testing.assert_close(gf, gn, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("causal", [False, True])
def test_auto_is_cpu_kernels_on_cpu(causal):
    w, temp, bias = _inputs((2, 3, 9, 4), torch.float32, causal, requires_grad=False)
    out = tssa(w, temp, causal=causal, bias=bias)
    assert torch.equal(out, tssa(w, temp, causal=causal, bias=bias, backend="cpu"))
    # the kernels and the PyTorch forward round differently: equal to float32 precision, not bit for bit
    torch.testing.assert_close(out, tssa(w, temp, causal=causal, bias=bias, backend="torch"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bnhp_view", "sliced", "p_strided"])
def test_cpu_kernels_take_strided_inputs(causal, layout):
    # the layers pass the "b n (h p) -> b h n p" view of their projection straight to the kernels
    g = torch.Generator().manual_seed(4)
    base = torch.randn(2, 70, 3, 10, generator=g, dtype=torch.float64)
    w = {
        "bnhp_view": base.transpose(1, 2),
        "sliced": base.transpose(1, 2)[:, :, 3:60:2, 1:8],
        "p_strided": base.transpose(1, 2)[..., ::2],
    }[layout]
    temp = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    bias = 0.3 * torch.randn(3, w.shape[2], 1, generator=g, dtype=torch.float64) if causal else None
    wr, wc = w.clone().requires_grad_(), w.clone().requires_grad_()
    ref = tssa(wr, temp, causal=causal, bias=bias, backend="naive")
    out = tssa(wc, temp, causal=causal, bias=bias, backend="cpu")
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    cot = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        torch.autograd.grad((out * cot).sum(), wc)[0],
        torch.autograd.grad((ref * cot).sum(), wr)[0],
        rtol=1e-10,
        atol=1e-10,
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [32, 48, 64])
def test_cpu_kernels_unrolled_head_dims_match_torch(causal, p):
    # the kernels are compiled separately for common head dims; these paths against the PyTorch backend in
    # float32 at a length of several chunks, with the layers' (B, N, H, P)-ordered view as input
    g = torch.Generator().manual_seed(p)
    w = torch.randn(2, 600, 4, p, generator=g).transpose(1, 2)
    temp = torch.tensor([0.5, 1.0, 2.0, 4.0])
    bias = 0.1 * torch.randn(4, 600, 1, generator=g) if causal else None
    cot = torch.randn(2, 4, 600, p, generator=g)
    res = {}
    for backend in ("torch", "cpu"):
        wb = w.clone().requires_grad_()
        out = tssa(wb, temp, causal=causal, bias=bias, backend=backend)
        res[backend] = (out, torch.autograd.grad((out * cot).sum(), wb)[0])
    torch.testing.assert_close(res["cpu"][0], res["torch"][0], rtol=1e-4, atol=1e-5)
    gt = res["torch"][1]
    torch.testing.assert_close(res["cpu"][1], gt, rtol=1e-4, atol=1e-4 * gt.abs().max().item())


def test_cpu_kernels_unavailable(monkeypatch):
    from attnzoo.ops import _cpu_kernels

    w, temp, _ = _inputs((1, 2, 5, 3), torch.float32, False, requires_grad=False)
    monkeypatch.setenv("ATTNZOO_CPU_KERNELS", "0")
    monkeypatch.setattr(_cpu_kernels, "_loaded", False)
    assert _cpu_kernels.cpu_kernels() is None
    # auto falls back to the PyTorch forward; asking for the kernels by name says why they are missing
    assert torch.equal(tssa(w, temp), tssa(w, temp, backend="torch"))
    with pytest.raises(RuntimeError, match="backend='cpu' needs .*ATTNZOO_CPU_KERNELS=0"):
        tssa(w, temp, backend="cpu")


def test_cpu_backend_rejects_other_devices():
    w = torch.empty(1, 2, 5, 3, device="meta")
    with pytest.raises(ValueError, match="backend='cpu' runs on CPU tensors, but w is on meta"):
        tssa(w, torch.ones(2, device="meta"), backend="cpu")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_computed_in_float32(causal, dtype):
    w, temp, bias = _inputs((2, 3, 200, 8), torch.float32, causal, requires_grad=False)
    w = w.to(dtype)
    ref = tssa_naive(w.double(), temp.double(), causal=causal, bias=None if bias is None else bias.double())
    out = tssa(w, temp, causal=causal, bias=bias)
    assert out.dtype == dtype
    with torch.autocast("cpu", dtype=dtype):  # autocast must not push the reductions to half precision
        assert torch.equal(tssa(w, temp, causal=causal, bias=bias), out)
    assert_half_close(out, ref)  # only the final rounding to the half type remains


@pytest.mark.parametrize("backend", ["torch", "cpu", "naive"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal, backend):
    w, temp, bias = _inputs((2, 3, 4, 2), torch.float64, causal, extra_len=1)
    args = (w, temp) if bias is None else (w, temp, bias)
    fn = lambda *a: tssa(*a[:2], causal=causal, bias=a[2] if causal else None, backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-6)


def test_torch_backend_is_first_order_only():
    w, temp, _ = _inputs((1, 2, 4, 3), torch.float64, False)
    (g,) = torch.autograd.grad(tssa(w, temp).sum(), w, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        torch.autograd.grad(g.sum(), w)
    # the naive reference supports double backward
    (g,) = torch.autograd.grad(tssa(w, temp, backend="naive").sum(), w, create_graph=True)
    assert torch.autograd.grad(g.sum(), w)[0].isfinite().all()


@pytest.mark.parametrize("backend", ["torch", "cpu", "naive"])
def test_noncausal_token_permutation_equivariance(backend):
    w, temp, _ = _inputs((2, 3, 11, 4), torch.float64, False, requires_grad=False)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    out = tssa(w, temp, backend=backend)
    torch.testing.assert_close(tssa(w[:, :, perm], temp, backend=backend), out[:, :, perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("causal", [False, True])
def test_zero_features_are_finite_and_agree(causal, backend):
    # a feature that is exactly 0 (everywhere, or for the first tokens) hits 0/0 in Alg. 2 and a zero
    # norm in Alg. 1; both backends must define it the same way (0/0 := 0) with finite gradients
    w, temp, bias = _inputs((2, 2, 9, 3), torch.float64, causal, requires_grad=False)
    w[:, :, :, 0] = 0
    w[:, :, :4, 1] = 0
    w[1, :, :3] = 0
    for t in (w, temp, bias):
        if t is not None:
            t.requires_grad_()
    out_n, grads_n = _out_and_grads(w, temp, bias, causal, "naive")
    out_f, grads_f = _out_and_grads(w, temp, bias, causal, backend)
    assert out_f.isfinite().all() and all(g.isfinite().all() for g in grads_f)
    torch.testing.assert_close(out_f, out_n, rtol=1e-12, atol=1e-12)
    for gf, gn in zip(grads_f, grads_n, strict=True):
        torch.testing.assert_close(gf, gn, rtol=1e-10, atol=1e-10)
    assert out_f[:, :, :, 0].abs().max() == 0


@pytest.mark.parametrize("backend", FAST)
def test_causal_long_sequence_float32_accuracy(backend):
    # N = 65536 in float32 against a float64 evaluation of the reference: prefix sums must stay accurate
    b, h, n, p = 1, 2, 65536, 2
    g = torch.Generator().manual_seed(0)
    w64 = torch.randn(b, h, n, p, generator=g, dtype=torch.float64) * torch.tensor([0.3, 3.0], dtype=torch.float64)
    temp64 = torch.tensor([1.0, 2.0], dtype=torch.float64)
    bias64 = 0.05 * torch.randn(h, n, 1, generator=g, dtype=torch.float64)
    cot = torch.randn(b, h, n, p, generator=g, dtype=torch.float64)
    w64.requires_grad_()
    ref = tssa_naive(w64, temp64, causal=True, bias=bias64)
    (gref,) = torch.autograd.grad((ref * cot).sum(), w64)
    w32 = w64.detach().float().requires_grad_()
    out = tssa(w32, temp64.float(), causal=True, bias=bias64.float(), backend=backend)
    (g32,) = torch.autograd.grad((out * cot.float()).sum(), w32)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g32.double(), gref, rtol=1e-4, atol=1e-5 * gref.abs().max().item())


def test_chunked_scans_match_float64_cumsum():
    x = torch.rand(2, 3, 1000, 2, dtype=torch.float64)
    for chunk in (1, 7, 32, 1000, 4096):
        torch.testing.assert_close(chunked_cumsum(x, chunk), x.cumsum(-2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reverse_chunked_cumsum(x), x.flip(-2).cumsum(-2).flip(-2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_pi_is_a_membership_matching_reference(causal):
    w, temp, bias = _inputs((2, 4, 13, 3), torch.float64, causal, requires_grad=False)
    pi = tssa_pi(w, temp, causal=causal, bias=bias)
    assert pi.shape == (2, 4, 13)
    torch.testing.assert_close(pi.sum(1), torch.ones(2, 13, dtype=torch.float64))
    torch.testing.assert_close(pi, tssa_pi(w, temp, causal=causal, bias=bias, backend="naive"))
    # with one head every token belongs to it
    one_head = tssa_pi(w[:, :1], temp[:1], causal=causal, bias=None)
    torch.testing.assert_close(one_head, torch.ones(2, 1, 13, dtype=torch.float64))


def test_recurrent_state_accumulates_in_float32_for_half_inputs():
    state = tssa_init_state(1, 2, 3, dtype=torch.bfloat16)
    assert state.sq_sum.dtype == torch.float32
    y, state = tssa_step(torch.randn(1, 2, 3, dtype=torch.bfloat16), torch.ones(2), state)
    assert y.dtype == torch.bfloat16 and state.num.dtype == torch.float32


def test_recurrent_step_past_bias_length_raises():
    _, temp, bias = _inputs((1, 3, 4, 2), torch.float64, True, requires_grad=False, extra_len=0)
    state = tssa_init_state(1, 3, 2, dtype=torch.float64)
    for _ in range(4):
        _, state = tssa_step(torch.randn(1, 3, 2, dtype=torch.float64), temp, state, bias=bias)
    with pytest.raises(ValueError, match=r"position 4 .*N_max=4"):
        tssa_step(torch.randn(1, 3, 2, dtype=torch.float64), temp, state, bias=bias)


# ---- input errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "torch", "cpu", "naive"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_finite_input_raises(backend, causal, dtype):
    # The fused non-causal path detects NaN/Inf through its sums of w^2 rather than a separate pass.
    w, temp, _ = _inputs((1, 2, 5, 3), torch.float32, False, requires_grad=False)
    for bad in (float("nan"), float("inf"), -float("inf")):
        w2 = w.clone().to(dtype)
        w2[0, 1, 2, 0] = bad
        with pytest.raises(ValueError, match="w contains non-finite"):
            tssa(w2, temp, causal=causal, backend=backend)
    assert torch.isfinite(tssa(w.to(dtype), temp, causal=causal, backend=backend)).all()
    with pytest.raises(ValueError, match="temp contains non-finite"):
        tssa(w, torch.tensor([1.0, float("nan")]))


def test_wrong_shapes_raise():
    w, temp, _ = _inputs((1, 2, 5, 3), torch.float32, False, requires_grad=False)
    with pytest.raises(ValueError, match=r"w must have shape \(B, H, N, P\)"):
        tssa(w[0], temp)
    with pytest.raises(ValueError, match=r"H, N, P >= 1"):
        tssa(w[:, :, :0], temp)
    with pytest.raises(TypeError, match="floating-point"):
        tssa(w.long(), temp)
    with pytest.raises(TypeError, match="causal must be a bool"):
        tssa(w, temp, causal=1)
    with pytest.raises(ValueError, match="backend='cuda' is not supported"):
        tssa(w, temp, backend="cuda")


@pytest.mark.parametrize("bad", [torch.ones(3), torch.ones(2, 1), torch.ones(1, 2), torch.tensor(1.0)])
def test_temp_shape_raises(bad):
    w, _, _ = _inputs((1, 2, 5, 3), torch.float32, False, requires_grad=False)
    with pytest.raises(ValueError, match=r"temp must have shape \(H,\)=\(2,\)"):
        tssa(w, bad)


def test_bias_errors():
    w, temp, _ = _inputs((1, 2, 5, 3), torch.float32, False, requires_grad=False)
    with pytest.raises(ValueError, match=r"N_max=4 .*N=5"):
        tssa(w, temp, causal=True, bias=torch.zeros(2, 4, 1))
    with pytest.raises(ValueError, match="only used by causal"):
        tssa(w, temp, causal=False, bias=torch.zeros(2, 5, 1))
    with pytest.raises(ValueError, match=r"bias must have shape \(H, N_max, 1\) with H=2"):
        tssa(w, temp, causal=True, bias=torch.zeros(3, 5, 1))
    with pytest.raises(ValueError, match="bias must have shape"):
        tssa(w, temp, causal=True, bias=torch.zeros(2, 5))


# ---- white-box identity (eqs. 4-7) -----------------------------------------------------------------
def _rvar(z, pi, us, shift=0.0):
    """Eq. 4 with f(x) = log(1 + x): 1/2 sum_k n_k/n sum_i f((U_k^T Z Diag(pi_k) Z^T U_k)_ii / n_k).

    ``z``: ``(B, n, d)`` tokens as rows; ``pi``: ``(B, K, n)``; ``us``: ``(K, d, p)``. ``shift`` replaces
    every n_k by n_k + shift (see the test). Summed over the batch (samples are independent).
    """
    n = z.shape[1]
    proj = torch.einsum("bnd,kdp->bknp", z, us)  # U_k^T z_j
    diag = torch.einsum("bkn,bknp->bkp", pi, proj**2)  # (U_k^T Z Diag(pi_k) Z^T U_k)_ii
    nk = pi.sum(-1, keepdim=True) + shift
    return 0.5 * (nk / n * torch.log1p(diag / nk)).sum()


def _whitebox_setup():
    g = torch.Generator().manual_seed(0)
    b, k, p, n = 2, 3, 4, 10
    d = k * p
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    us = q.reshape(d, k, p).permute(1, 0, 2).contiguous()  # K orthonormal (d, p) blocks, U_k in O(d, p)
    z = torch.randn(b, n, d, generator=g, dtype=torch.float64) * 2.0
    temp = torch.tensor([0.7, 2.0, 3.5], dtype=torch.float64)
    return z, us, temp


@pytest.mark.parametrize("backend", ["torch", "naive"])
def test_whitebox_identity_gradient_of_variational_rate(backend):
    """sum_k U_k tssa(U_k^T Z)_k == -n grad_Z R^var_c(Z, Pi | U)  (Pi held fixed), f(x) = log(1 + x).

    Derivation (eqs. 4-6): with m_ki = sum_j (U_k^T z_j)_i^2 pi_jk / n_k, d m_ki / d(U_k^T z_j)_i =
    2 (U_k^T z_j)_i pi_jk / n_k, so grad_{z_j} R^var = 1/2 sum_k (n_k / n) U_k f'(m_k) 2 (U_k^T z_j) pi_jk / n_k
    = (1/n) sum_k pi_jk U_k Diag(f'(m_k)) U_k^T z_j (eq. 6): the 1/2 cancels the 2 of the square and
    (n_k/n)(1/n_k) = 1/n. Alg. 1 computes -pi_jk (U_k^T z_j) / (1 + m_k) = -pi_jk Diag(f'(m_k)) U_k^T z_j,
    so the constant is exactly -n, with one caveat: Alg. 1 normalises pi_k by n_k + 1e-8, not n_k.
    Replacing n_k by n_k + 1e-8 in both places of eq. 4 leaves the derivation unchanged (the factor is
    still (n_k'/n)(1/n_k') = 1/n), so the identity is exact against that eq. 4; against the literal eq. 4
    the two sides differ only by the relative perturbation 1e-8 / n_k of the second moments.
    """
    z, us, temp = _whitebox_setup()
    n = z.shape[1]
    w = torch.einsum("bnd,kdp->bknp", z, us)
    out = tssa(w, temp, backend=backend)  # (B, K, n, p)
    lhs = torch.einsum("bknp,kdp->bnd", out, us)  # sum_k U_k tssa(U_k^T Z)_k, tokens as rows
    pi = tssa_pi(w, temp).detach()  # Pi held fixed
    assert pi.min() < 0.2 and pi.max() > 0.5  # a non-trivial grouping, not uniform memberships

    zg = z.clone().requires_grad_()
    (grad_exact,) = torch.autograd.grad(_rvar(zg, pi, us, shift=1e-8), zg)
    torch.testing.assert_close(lhs, -n * grad_exact, rtol=1e-11, atol=1e-13)

    (grad_lit,) = torch.autograd.grad(_rvar(zg, pi, us), zg)
    # second moments scale by n_k / (n_k + 1e-8), so 1 / (1 + m_ki) and each head's term U_k out_k move by at
    # most 1e-8 / n_k relatively; per token, |lhs - (-n grad)| <= 1e-8 / min n_k * sum_k |out_kj| (+ rounding)
    bound = 1e-8 / pi.sum(-1).min() * out.norm(dim=-1).sum(1)  # (B, n)
    gap = (lhs + n * grad_lit).norm(dim=-1)
    assert (gap <= 1.01 * bound + 1e-13).all()
    assert gap.max() > 1e-3 * bound.max()  # the 1e-8 is visible: the literal identity is not exact
    # the identity really pins the constant: -n/2 or -(n-1) would fail
    assert not torch.allclose(lhs, -(n - 1) * grad_lit, rtol=1e-3, atol=0)


@pytest.mark.parametrize("masked", [False, True])
def test_recurrent_step_checks_the_bias_entry_it_reads(masked):
    """A step reads (and checks) the causal bias at its own position only: a non-finite entry there is an error
    naming the bias; one at a later position leaves the step unchanged (its cost does not grow with N_max)."""
    temp, w = torch.ones(3, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    mask = torch.ones(2, dtype=torch.bool) if masked else None
    bias = torch.randn(3, 8, 1, dtype=torch.float64)
    want, _ = tssa_step(w, temp, tssa_init_state(2, 3, 4, dtype=torch.float64), bias=bias, attention_mask=mask)
    later = bias.clone()
    later[1, 5, 0] = float("nan")
    got, _ = tssa_step(w, temp, tssa_init_state(2, 3, 4, dtype=torch.float64), bias=later, attention_mask=mask)
    assert torch.equal(got, want)
    here = bias.clone()
    here[1, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="bias contains non-finite"):
        tssa_step(w, temp, tssa_init_state(2, 3, 4, dtype=torch.float64), bias=here, attention_mask=mask)
