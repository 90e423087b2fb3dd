"""MEGA's single-head attention: the chunked path against the explicit map, and the formulas of MEGA §3.2-3.5."""

import math

import pytest
import torch

from attnzoo.ops.mega import mega_attention
from attnzoo.ops.mega.naive import laplace

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors on a shared 2-core machine

SHAPES = [(1, 1, 2, 3), (2, 7, 3, 4), (1, 16, 4, 2), (2, 33, 2, 5)]  # (B, N, Z, E)
TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=2e-5, rtol=2e-5)}


def _inputs(B, N, Z, E, R, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype) for s in ((B, N, Z), (B, N, Z), (B, N, E), (2 * R - 1,))]


def _fwd_bwd(ts, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in ts]
    y = mega_attention(*leaves, **kw)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape))
    return [y.detach()] + [t.grad for t in leaves]


CASES = [(s, torch.float64) for s in SHAPES] + [(SHAPES[3], torch.float32)]


@pytest.mark.parametrize("shape,dtype", CASES)
@pytest.mark.parametrize("fn", ["softmax", "laplace"])
@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
def test_chunked_matches_reference_forward_backward(shape, dtype, fn, chunk_size):
    B, N, Z, E = shape
    R = N if chunk_size is None else min(chunk_size, N)
    ts = _inputs(B, N, Z, E, R + 1, dtype)  # a bias longer than the span: only its middle is read
    ref = _fwd_bwd(ts, fn=fn, chunk_size=chunk_size, backend="naive")
    got = _fwd_bwd(ts, fn=fn, chunk_size=chunk_size, backend="torch")
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, **TOL[dtype])


def _by_hand(q, k, v, b, fn, chunk):
    # MEGA §3.2-3.3 one query at a time, over the keys of its chunk
    B, N, Z = q.shape
    R = (b.shape[0] + 1) // 2
    out = torch.zeros(B, N, v.shape[2], dtype=q.dtype)
    for bi in range(B):
        for i in range(N):
            keys = [j for j in range(N) if j // chunk == i // chunk]
            s = torch.stack([q[bi, i] @ k[bi, j] for j in keys])
            bias = torch.stack([b[R - 1 + j - i] for j in keys])
            if fn == "softmax":
                w = torch.softmax(s / math.sqrt(Z) + bias, 0)
            else:
                x = s / len(keys) + bias
                w = torch.tensor(
                    [0.5 * (1 + math.erf((float(t) - math.sqrt(0.5)) / math.sqrt(1 / (2 * math.pi)))) for t in x],
                    dtype=q.dtype,
                )
            out[bi, i] = (w[:, None] * v[bi, keys]).sum(0)
    return out


@pytest.mark.parametrize("fn", ["softmax", "laplace"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_matches_mega_equations_by_hand(fn, chunk_size):
    q, k, v, b = _inputs(2, 7, 3, 2, 7, torch.float64, seed=3)
    want = _by_hand(q, k, v, b, fn, chunk_size or 7)
    for backend in ("naive", "torch"):
        got = mega_attention(q, k, v, b, fn=fn, chunk_size=chunk_size, backend=backend)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_laplace_function_is_the_normal_cdf_mega_chose():
    # f(mu) = 1/2 and f'(mu) = 1 / (sigma sqrt(2 pi)) with mu = sqrt(1/2), sigma = 1 / sqrt(4 pi) (MEGA §3.3)
    mu = torch.tensor(math.sqrt(0.5), dtype=torch.float64, requires_grad=True)
    y = laplace(mu)
    (g,) = torch.autograd.grad(y, mu)
    assert abs(float(y.detach()) - 0.5) < 1e-15
    assert abs(float(g) - math.sqrt(4 * math.pi) / math.sqrt(2 * math.pi)) < 1e-12


def test_chunks_do_not_see_each_other():
    q, k, v, b = _inputs(1, 12, 3, 2, 4, torch.float64)
    v2 = v.clone()
    v2[:, 8:] += 1.0  # the third chunk of four tokens
    for backend in ("naive", "torch"):
        y = mega_attention(q, k, v, b, chunk_size=4, backend=backend)
        y2 = mega_attention(q, k, v2, b, chunk_size=4, backend=backend)
        torch.testing.assert_close(y2[:, :8], y[:, :8], rtol=0, atol=0)
        assert not torch.allclose(y2[:, 8:], y[:, 8:])


def test_bad_inputs_are_named():
    q, k, v, b = _inputs(1, 6, 3, 2, 6, torch.float32)
    with pytest.raises(ValueError, match=r"fn='relu2' is not supported; valid choices: \['softmax', 'laplace'\]"):
        mega_attention(q, k, v, b, fn="relu2")
    with pytest.raises(ValueError, match=r"rel_bias must hold 2R - 1 values with R >= 6 \(the attention's span: N\)"):
        mega_attention(q, k, v, b[:9])
    with pytest.raises(ValueError, match=r"R >= 4 \(the attention's span: chunk_size\), got 6"):
        mega_attention(q, k, v, b[:6], chunk_size=4)
    with pytest.raises(ValueError, match="chunk_size must be None or a positive integer, got 0"):
        mega_attention(q, k, v, b, chunk_size=0)
    with pytest.raises(ValueError, match=r"q and k must share one shape"):
        mega_attention(q, k[:, :5], v, b)
    with pytest.raises(ValueError, match=r"v must have q's \(B, N\)"):
        mega_attention(q, k, v[:, :5], b)
    with pytest.raises(ValueError, match="backend='fast' is not supported by mega_attention"):
        mega_attention(q, k, v, b, backend="fast")
