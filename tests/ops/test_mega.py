"""MEGA's single-head attention: the chunked path against the explicit map, and the formulas of MEGA §3.2-3.5."""

import math

import pytest
import torch

from attnzoo.ops.mega import mega_attention
from attnzoo.ops.mega.naive import laplace
from attnzoo.ops.mega.step import mega_attention_step

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


def _by_hand(q, k, v, b, fn, chunk, causal=False):
    # MEGA §3.2-3.3 one query at a time, over the keys of its chunk (up to the query itself when causal)
    B, N, Z = q.shape
    R = (b.shape[0] + 1) // 2
    out = torch.zeros(B, N, v.shape[2], dtype=q.dtype)
    for bi in range(B):
        for i in range(N):
            keys = [j for j in range(N) if j // chunk == i // chunk and (j <= i or not causal)]
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


@pytest.mark.parametrize("shape,dtype", CASES)
@pytest.mark.parametrize("fn", ["softmax", "laplace"])
@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
def test_causal_chunked_matches_reference_forward_backward(shape, dtype, fn, chunk_size):
    B, N, Z, E = shape
    R = N if chunk_size is None else min(chunk_size, N)
    ts = _inputs(B, N, Z, E, R + 1, dtype, seed=1)
    ref = _fwd_bwd(ts, fn=fn, chunk_size=chunk_size, causal=True, backend="naive")
    got = _fwd_bwd(ts, fn=fn, chunk_size=chunk_size, causal=True, backend="torch")
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, **TOL[dtype])


@pytest.mark.parametrize("fn", ["softmax", "laplace"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_causal_matches_mega_equations_by_hand(fn, chunk_size):
    # the Laplace scale is the number of keys the query reads (MEGA's code: its attention mask's row sums)
    q, k, v, b = _inputs(2, 7, 3, 2, 7, torch.float64, seed=4)
    want = _by_hand(q, k, v, b, fn, chunk_size or 7, causal=True)
    for backend in ("naive", "torch"):
        got = mega_attention(q, k, v, b, fn=fn, chunk_size=chunk_size, causal=True, backend=backend)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert not torch.allclose(mega_attention(q, k, v, b, fn=fn, chunk_size=chunk_size), want)


@pytest.mark.parametrize("fn", ["softmax", "laplace"])
@pytest.mark.parametrize("chunk_size", [None, 4])
@pytest.mark.parametrize("t", [0, 3, 4, 8])
def test_causal_attention_reads_no_future_token(fn, chunk_size, t):
    q, k, v, b = _inputs(2, 11, 3, 2, 11, torch.float64, seed=5)
    k2, v2 = k.clone(), v.clone()
    k2[:, t + 1 :] += 1.0
    v2[:, t + 1 :] -= 1.0
    for backend in ("naive", "torch"):
        y = mega_attention(q, k, v, b, fn=fn, chunk_size=chunk_size, causal=True, backend=backend)
        y2 = mega_attention(q, k2, v2, b, fn=fn, chunk_size=chunk_size, causal=True, backend=backend)
        torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=0)
        assert not torch.allclose(y2[:, t + 1 :], y[:, t + 1 :])


@pytest.mark.parametrize("fn", ["softmax", "laplace"])
@pytest.mark.parametrize("chunk_size", [None, 1, 4])
def test_step_is_the_causal_forwards_row(fn, chunk_size):
    # the cache holds every key so far (-1 marks one empty slot); the step reads those of the query's chunk
    B, N, Z, E = 2, 10, 3, 4
    q, k, v, b = _inputs(B, N, Z, E, N, torch.float64, seed=6)
    full = mega_attention(q, k, v, b, fn=fn, chunk_size=chunk_size, causal=True, backend="naive")
    for t in range(N):
        kc = torch.cat([k[:, : t + 1], torch.randn(B, 1, Z, dtype=k.dtype)], 1)
        vc = torch.cat([v[:, : t + 1], torch.randn(B, 1, E, dtype=v.dtype)], 1)
        kpos = torch.cat([torch.arange(t + 1).expand(B, -1), torch.full((B, 1), -1)], 1)
        pos = torch.full((B,), t)
        got = mega_attention_step(q[:, t : t + 1], kc, vc, b, kpos, pos, fn=fn, chunk=chunk_size)
        torch.testing.assert_close(got, full[:, t : t + 1], atol=1e-12, rtol=1e-12)


def test_causal_is_checked():
    q, k, v, b = _inputs(1, 4, 3, 2, 4, torch.float32)
    with pytest.raises(TypeError, match="causal must be a bool, got 1"):
        mega_attention(q, k, v, b, causal=1)
