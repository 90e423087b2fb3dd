"""Fastmax op (FAST): factorised paths vs the explicit-matrix reference, custom backward, recurrence, dropout."""

import importlib

import pytest
import torch
from conftest import assert_half_close

from attnzoo._checks import NonFiniteError
from attnzoo.ops.fastmax import (
    EPS,
    explicit_attention,
    fastmax,
    fastmax_dropout,
    fastmax_init_state,
    fastmax_naive,
    fastmax_step,
    sample_dropout_masks,
)
from attnzoo.ops.fastmax.common import feature_dim, standardize
from attnzoo.ops.fastmax.naive import standardize_naive


def _qkv(b, h, n, d, dv=None, dtype=torch.float64, grad=False):
    dv = d if dv is None else dv
    q = torch.randn(b, h, n, d, dtype=dtype)
    k = torch.randn(b, h, n, d, dtype=dtype)
    v = torch.randn(b, h, n, dv, dtype=dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def _safe_scale(p, d):
    # p=1 with scale > 1/D allows weights of either sign and near-zero denominators (ill-conditioned
    # comparisons); the default scale for p=1 is covered separately in float64.
    return 1.0 / d if p == 1 else None


SHAPES = [(1, 1, 1, 3, 3), (2, 3, 2, 4, 4), (1, 2, 7, 5, 3), (2, 1, 33, 4, 6)]


# ---------------------------------------------------------------- forward / backward vs naive


@pytest.mark.parametrize("backend", ["torch", "torch_autograd", "cpu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("unmasked_chunks", ["many", "default"])
def test_matches_naive_float64(backend, causal, p, shape, unmasked_chunks, monkeypatch):
    if unmasked_chunks == "many":
        # unmasked sweeps take chunks of >= 2^18 feature elements by default (one chunk at these sizes);
        # a budget of 1 brings them down to chunk_size=3, so the multi-chunk sums are exercised too
        from attnzoo.ops.fastmax import chunk as factorized

        monkeypatch.setattr(factorized, "_UNMASKED_FEATURES", 1)
    b, h, n, d, dv = shape
    q, k, v = _qkv(b, h, n, d, dv, grad=True)
    scale = _safe_scale(p, d)
    ref = fastmax_naive(q, k, v, p=p, causal=causal, scale=scale)
    out = fastmax(q, k, v, p=p, causal=causal, scale=scale, backend=backend, chunk_size=3)
    assert out.shape == (b, h, n, dv) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    g_out = torch.autograd.grad((out * w).sum(), (q, k, v))
    for a, r in zip(g_out, g_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 1.0])
def test_p1_default_and_literal_scale_float64(causal, scale):
    q, k, v = _qkv(2, 2, 9, 4, grad=True)
    ref = fastmax_naive(q, k, v, p=1, causal=causal, scale=scale)
    out = fastmax(q, k, v, p=1, causal=causal, scale=scale, chunk_size=4)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-8)
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    g_out = torch.autograd.grad(out.sum(), (q, k, v))
    for a, r in zip(g_out, g_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-6)


def test_p2_literal_scale_float64():
    q, k, v = _qkv(1, 2, 11, 4, grad=True)
    for causal in (False, True):
        ref = fastmax_naive(q, k, v, p=2, causal=causal, scale=1.0)
        out = fastmax(q, k, v, p=2, causal=causal, scale=1.0, chunk_size=4)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
def test_gradcheck_custom_backward(causal, p):
    q, k, v = _qkv(1, 1, 5, 3, 2, grad=True)
    scale = _safe_scale(p, 3)

    def f(q, k, v):
        return fastmax(q, k, v, p=p, causal=causal, scale=scale, backend="torch", chunk_size=2)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_naive(causal):
    q, k, v = _qkv(1, 1, 4, 3, grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: fastmax_naive(q, k, v, causal=causal), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_custom_backward_saves_only_linear_memory(causal):
    b, h, n, d = 1, 2, 32, 8
    q, k, v = _qkv(b, h, n, d, dtype=torch.float32, grad=True)
    saved = {}
    for backend in ("torch", "torch_autograd"):
        sizes = []

        def pack(t, sizes=sizes):
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fastmax(q, k, v, causal=causal, backend=backend, chunk_size=8)
        saved[backend] = sizes
    # §2.5: every tensor the custom Function path keeps is O(N D) per head
    assert max(saved["torch"]) <= b * h * n * d
    assert sum(saved["torch"]) <= 12 * b * h * n * d
    # autograd through the factorisation keeps the O(N D^2) features (and causal prefix states)
    assert sum(saved["torch_autograd"]) > b * h * n * feature_dim(d, 2)


# ---------------------------------------------------------------- causality


# ---------------------------------------------------------------- identity 3 and eq 10


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
def test_explicit_matrix_times_v_equals_factorised(causal, p):
    q, k, v = _qkv(2, 2, 10, 4, 5)
    scale = _safe_scale(p, 4)
    a = explicit_attention(q, k, p=p, causal=causal, scale=scale)
    assert a.shape == (2, 2, 10, 10)
    out = fastmax(q, k, v, p=p, causal=causal, scale=scale, chunk_size=3)
    torch.testing.assert_close(a @ v, out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 10, dtype=a.dtype), rtol=1e-12, atol=1e-12)
    if causal:
        assert torch.all(a.triu(1) == 0)


@pytest.mark.parametrize("scale", [None, 1.0, 3.0])
def test_p2_weights_positive_for_any_input(scale):
    # f(s) = ((1 + s)^2 + 1) / 2 >= 1/2: positive even for adversarial k = -q and the literal scale
    q, _, _ = _qkv(2, 2, 12, 6)
    for k in (-q, torch.randn_like(q) * 10, q):
        for causal in (False, True):
            a = explicit_attention(q, k, p=2, causal=causal, scale=scale)
            allowed = a if not causal else a[..., torch.ones(12, 12, dtype=torch.bool).tril()]
            assert torch.all(allowed > 0)
            torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]))


def test_p1_score_bound_and_nonnegativity_condition():
    d = 6
    q, k, _ = _qkv(2, 2, 12, d)
    qh, kh = standardize_naive(q), standardize_naive(k)
    # ||x_hat||^2 = D var/(var + eps) < D, hence |q_hat . k_hat| < D (Cauchy-Schwarz)
    assert torch.all((qh * qh).sum(-1) < d)
    for kk in (kh, -qh):
        assert torch.all((qh @ kk.transpose(-1, -2)).abs() < d)
    # scale <= 1/D: 1 + s > 0 for every input, including the extreme k = -q
    for kk in (k, -q, -3 * q + 0.5):
        a = explicit_attention(q, kk, p=1, scale=1.0 / d)
        assert torch.all(a >= 0)
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]))
    # the default scale D**-0.5 > 1/D: k = -q drives s_ii to about -sqrt(D) < -1, a negative weight
    a = explicit_attention(q, -q, p=1)
    assert a.diagonal(dim1=-2, dim2=-1).min() < 0
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]))


def test_standardisation_matches_and_is_standard():
    x = torch.randn(3, 2, 5, 7, dtype=torch.float64) * 4 + 2
    xs = standardize(x)
    torch.testing.assert_close(xs, standardize_naive(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xs.mean(-1), torch.zeros(3, 2, 5, dtype=x.dtype), atol=1e-12, rtol=0)
    var = x.var(-1, unbiased=False)
    torch.testing.assert_close(xs.pow(2).mean(-1), var / (var + EPS), rtol=1e-12, atol=1e-12)


def test_head_dim_one_is_uniform_attention():
    # a single feature standardises to 0: s = 0, f = 1, plain (causal) mean of v
    q, k, v = _qkv(1, 1, 6, 1, 3)
    out = fastmax(q, k, v, causal=True)
    ref = v.cumsum(2) / torch.arange(1, 7, dtype=v.dtype).view(1, 1, 6, 1)
    torch.testing.assert_close(out, ref)


# ---------------------------------------------------------------- low precision


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_inputs_accumulate_in_float32(dtype, causal):
    q, k, v = _qkv(1, 2, 300, 8, dtype=torch.float32)
    qh, kh, vh = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
    out = fastmax(qh, kh, vh, causal=causal)  # default chunk 64: 5 chunks, the last partial
    assert out.dtype == dtype
    ref = fastmax_naive(*(t.detach().double() for t in (qh, kh, vh)), causal=causal)
    assert_half_close(out, ref)  # only the final cast rounds: 300 tokens summed in half would drift past it
    out.float().sum().backward()
    assert qh.grad.dtype == dtype and torch.isfinite(qh.grad.float()).all()


# ---------------------------------------------------------------- recurrence


def test_step_state_is_float32_for_half():
    state = fastmax_init_state(1, 1, 4, dtype=torch.bfloat16)
    assert state.num.dtype == torch.float32 and state.den.dtype == torch.float32
    q, k, v = (t.bfloat16() for t in _qkv(1, 1, 1, 4, dtype=torch.float32))
    o, state = fastmax_step(q, k, v, state)
    assert o.dtype == torch.bfloat16 and state.num.dtype == torch.float32


@pytest.mark.parametrize("p", [1, 2])
def test_decoding_state_holds_the_symmetric_half_and_reads_like_the_full_features(p):
    # the state keeps (q . k)^2 / 2's symmetric half: 1 + D + D(D+1)/2 rows at p = 2 (1 + D + D^2 in full), and
    # its features give the kernel's weights f(q . k) = 1 + s + s^2 / 2 exactly as the full map does
    from attnzoo.ops.fastmax.common import features, half_features

    d = 5
    state = fastmax_init_state(2, 3, d, 7, p=p)
    assert state.num.shape == (2, 3, 1 + d + (d * (d + 1) // 2 if p == 2 else 0), 7)
    q, k = torch.randn(2, 4, d, dtype=torch.float64), torch.randn(2, 6, d, dtype=torch.float64)
    s = q @ k.transpose(-1, -2)
    want = 1 + s + (s * s / 2 if p == 2 else 0)
    torch.testing.assert_close(half_features(q, p) @ half_features(k, p).transpose(-1, -2), want)
    torch.testing.assert_close(features(q, p) @ features(k, p).transpose(-1, -2), want)


def test_step_errors():
    state = fastmax_init_state(1, 2, 4)
    q, k, v = _qkv(1, 2, 2, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="one token"):
        fastmax_step(q, k, v, state)
    q1, k1, v1 = q[:, :, :1], k[:, :, :1], v[:, :, :1]
    with pytest.raises(ValueError, match="state shapes"):
        fastmax_step(q1, k1, v1, state, p=1)
    with pytest.raises(TypeError, match="FastmaxState"):
        fastmax_step(q1, k1, v1, (state.num, state.den))


# ---------------------------------------------------------------- dropout placements (FAST §2.4)


def _feature_masked_reference(qs, kh, v, m, d, causal):
    """Independent p=2 form: m0 + sum_d m1_d q_d k_d + 1/2 sum_de m2_de q_d q_e k_d k_e."""
    m0, m1, m2 = m[..., :1], m[..., 1 : 1 + d], m[..., 1 + d :].unflatten(-1, (d, d))
    w = m0.unsqueeze(-1) + torch.einsum("bhid,bhd,bhjd->bhij", qs, m1, kh)
    w = w + 0.5 * torch.einsum("bhid,bhie,bhde,bhjd,bhje->bhij", qs, qs, m2, kh, kh)
    if causal:
        w = w.tril()
    return (w / w.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("placement", ["standard", "quadratic"])
@pytest.mark.parametrize("causal", [False, True])
def test_feature_dropout_matches_explicit(placement, causal):
    b, h, n, d = 2, 2, 9, 3
    q, k, v = _qkv(b, h, n, d, grad=True)
    masks = sample_dropout_masks(placement, 0.3, shape=(b, h, n, d), p=2, dtype=torch.float64)
    m = masks["feat"]
    assert torch.all(m[..., 0] == 1)  # order-0 terms are never dropped
    if placement == "quadratic":
        assert torch.all(m[..., : 1 + d] == 1)
    assert set(m.unique().tolist()) <= {0.0, 1.0, 1 / 0.7} and (m == 0).any()
    scale = d**-0.5
    out = fastmax_dropout(q, k, v, rate=0.3, placement=placement, causal=causal, masks=masks, chunk_size=4)
    naive = fastmax_dropout(q, k, v, rate=0.3, placement=placement, causal=causal, masks=masks, backend="naive")
    ref = _feature_masked_reference(standardize_naive(q) * scale, standardize_naive(k), v, m, d, causal)
    torch.testing.assert_close(naive, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.autograd.grad(out.sum(), (q, k, v))
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, r in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("causal", [False, True])
def test_token_dropout_1d_matches_explicit(causal):
    b, h, n, d = 2, 2, 9, 4
    q, k, v = _qkv(b, h, n, d, grad=True)
    masks = sample_dropout_masks("1d", 0.5, shape=(b, h, n, d), p=2, dtype=torch.float64)
    assert masks["q"].shape == (b, h, n, 1) and (masks["k"] == 0).any()
    out = fastmax_dropout(q, k, v, rate=0.5, placement="1d", causal=causal, masks=masks, chunk_size=4)
    qs = standardize_naive(q) * d**-0.5 * masks["q"]
    kh = standardize_naive(k) * masks["k"]
    s = qs @ kh.transpose(-1, -2)
    w = 1 + s + s * s / 2
    if causal:
        w = w.tril()
    ref = (w / w.sum(-1, keepdim=True)) @ v
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.autograd.grad(out.sum(), (q, k, v))
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, r in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-8)


def test_dropout_all_kept_equals_fastmax_and_sampling_varies():
    q, k, v = _qkv(1, 2, 8, 3)
    ones = {"feat": torch.ones(1, 2, feature_dim(3, 2), dtype=torch.float64)}
    out = fastmax_dropout(q, k, v, rate=0.2, placement="standard", causal=True, masks=ones)
    torch.testing.assert_close(out, fastmax(q, k, v, causal=True))
    a = fastmax_dropout(q, k, v, rate=0.5, placement="quadratic")
    b = fastmax_dropout(q, k, v, rate=0.5, placement="quadratic")
    assert not torch.allclose(a, b)


def test_dropout_errors():
    q, k, v = _qkv(1, 1, 4, 3)
    with pytest.raises(ValueError, match="dropout_placement='bogus'"):
        fastmax_dropout(q, k, v, rate=0.1, placement="bogus")
    with pytest.raises(ValueError, match="needs p=2"):
        fastmax_dropout(q, k, v, rate=0.1, placement="quadratic", p=1)
    with pytest.raises(ValueError, match=r"rate must be a probability in \[0, 1\), got 1.0"):
        fastmax_dropout(q, k, v, rate=1.0, placement="standard")


# ---------------------------------------------------------------- input validation


def test_errors(monkeypatch):
    fm = importlib.import_module("attnzoo.ops.fastmax")  # the sub-package; attnzoo.ops.fastmax is the function

    q, k, v = _qkv(1, 2, 4, 3, dtype=torch.float32)
    for bad in (3, 0, 2.0, True):
        with pytest.raises(ValueError, match=r"p=.* is not supported.*\[1, 2\]"):
            fastmax(q, k, v, p=bad)
    with pytest.raises(ValueError, match="backend='cuda' is not supported"):
        fastmax(q, k, v, backend="cuda")
    monkeypatch.setattr(fm, "_triton_available", lambda: False)
    with pytest.raises(ValueError, match="backend='triton' is not available"):
        fastmax(q, k, v, backend="triton")
    with pytest.raises(ValueError, match="scale=-1.0 must be a finite positive"):
        fastmax(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        fastmax(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        fastmax(q, k[..., :2], v)
    with pytest.raises(ValueError, match="v must agree with q"):
        fastmax(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match=r"\(B, H, N, D\)"):
        fastmax(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="floating-point"):
        fastmax(q.long(), k.long(), v.long())
    with pytest.raises(TypeError, match="share one dtype"):
        fastmax(q, k.double(), v)
    with pytest.raises(ValueError, match=r"p=3 is not supported"):
        explicit_attention(q, k, p=3)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (2, 3, 9, 5, 3), (1, 2, 31, 6, 7)])
def test_unmasked_torch_path_contracts_moments_without_features(p, shape, monkeypatch):
    """Eqs 11-12 without the concatenated phi or [v, 1] (forward and FAST §2.5 backward), still exact."""
    from attnzoo.ops.fastmax import chunk as factorized

    def forbidden(*args, **kwargs):
        raise AssertionError("the unmasked path must not build the concatenated feature map")

    monkeypatch.setattr(factorized, "features", forbidden)
    monkeypatch.setattr(factorized, "features_vjp", forbidden)
    monkeypatch.setattr(factorized, "_append_one", forbidden)
    monkeypatch.setattr(factorized, "_UNMASKED_FEATURES", 40)  # several second-order chunks
    b, h, n, d, dv = shape
    q, k, v = _qkv(b, h, n, d, dv, grad=True)
    ref = fastmax_naive(q, k, v, p=p, scale=_safe_scale(p, d))
    out = fastmax(q, k, v, p=p, scale=_safe_scale(p, d), backend="torch")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(ref)
    for a, r in zip(
        torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v)), strict=True
    ):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-9)


def test_standardize_scale_rides_in_the_affine_weight():
    x = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    torch.testing.assert_close(standardize(x, scale=0.3), standardize_naive(x) * 0.3, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("n", "d", "p", "want"),
    [
        (17, 16, 2, "explicit"),
        (128, 16, 2, "explicit"),
        (129, 16, 2, "torch"),
        (256, 64, 2, "explicit"),
        (257, 64, 2, "torch"),
        (8, 16, 1, "explicit"),
        (9, 16, 1, "torch"),
    ],
)
def test_auto_takes_the_explicit_form_for_short_sequences(monkeypatch, n, d, p, want):
    from attnzoo.ops import _cpu_kernels
    from attnzoo.ops._dispatch import resolve_backend
    from attnzoo.ops.fastmax import FASTMAX

    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)  # no fused kernel in the way
    # under autograd: the N x N weights are kept for the backward, so N <= 256 as well
    q, k, v = (torch.randn(1, 1, n, d, requires_grad=True) for _ in "qkv")
    opts = dict(p=p, causal=True, scale=None, chunk_size=None)
    assert resolve_backend(FASTMAX, "auto", q, inputs=(q, k, v), options=opts) == want
    # a masked call stays on the factorised sweeps (the explicit form does not take masks)
    assert resolve_backend(FASTMAX, "auto", q, inputs=(q, k, v), options=dict(opts, segs=object())) == "torch"


@pytest.mark.parametrize(
    ("b", "h", "n", "causal", "want"),
    [
        (1, 12, 768, True, "explicit"),  # a swapped GPT-2's prefill of 768 tokens at D = 64
        (1, 1, 1024, True, "explicit"),  # causal: N = D^p / 4
        (1, 1, 1025, True, "torch"),
        (1, 1, 512, False, "explicit"),  # non-causal: N = D^p / 8
        (1, 1, 513, False, "torch"),
        (16, 16, 512, True, "torch"),  # 67M weights: over EXPLICIT_MAX_WEIGHTS
    ],
)
def test_auto_takes_the_explicit_form_without_autograd_by_cost_and_weights(monkeypatch, b, h, n, causal, want):
    from attnzoo.ops import _cpu_kernels
    from attnzoo.ops._dispatch import resolve_backend
    from attnzoo.ops.fastmax import FASTMAX

    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    q = torch.empty(b, h, n, 64)
    opts = dict(p=2, causal=causal, scale=None, chunk_size=None)
    assert resolve_backend(FASTMAX, "auto", q, inputs=(q, q, q), options=opts) == want
    with torch.enable_grad():  # the same call under autograd keeps to N <= 256
        qg = q.requires_grad_()
        assert resolve_backend(FASTMAX, "auto", qg, inputs=(qg, qg, qg), options=opts) == "torch"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
def test_explicit_backend_equals_the_factorised_one(causal, p):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 13, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    outs = {}
    for b in ("explicit", "torch"):
        out = fastmax(q, k, v, p=p, causal=causal, backend=b)
        outs[b] = (out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    for a, b in zip(outs["explicit"], outs["torch"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    bad = q.detach().clone()
    bad[0, 0, 3, 1] = float("nan")
    with pytest.raises(NonFiniteError):
        fastmax(bad, k, v, p=p, causal=causal, backend="explicit")
