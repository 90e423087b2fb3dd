"""MEGA's damped EMA: the FFT convolution and the recurrent step against the literal recurrence (MEGA §3.1)."""

import pytest
import torch

from attnzoo.ops.ema import ema, ema_kernel, ema_step
from attnzoo.ops.ema.scan import ema_scan

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors on a shared 2-core machine

SHAPES = [(1, 1, 1, 1), (2, 7, 3, 4), (1, 16, 5, 2), (2, 33, 2, 3)]  # (B, N, D, h)
TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=2e-5, rtol=2e-5)}


def _coeffs(D, h, causal, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = (D, h) if causal else (2, D, h)
    alpha = torch.rand(lead, generator=g, dtype=dtype) * 0.9 + 0.05
    delta = torch.rand(lead, generator=g, dtype=dtype) * 0.9 + 0.05
    beta = torch.randn(lead, generator=g, dtype=dtype)
    eta = torch.randn(lead, generator=g, dtype=dtype)
    return alpha, delta, beta, eta


def _fwd_bwd(x, coeffs, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, *coeffs)]
    y = ema(*leaves, **kw)
    g = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
    y.backward(g)
    return [y.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_fft_matches_recurrence_forward_backward(shape, dtype, causal):
    B, N, D, h = shape
    x = torch.randn(B, N, D, dtype=dtype)
    coeffs = _coeffs(D, h, causal, dtype)
    ref = _fwd_bwd(x, coeffs, causal=causal, backend="naive")
    got = _fwd_bwd(x, coeffs, causal=causal, backend="torch")
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, **TOL[dtype])
    assert ref[0].abs().sum() > 0


def test_recurrence_is_mega_eq_3_by_hand():
    # one channel, h = 2, three tokens, written out: h_t = a b x_t + (1 - a d) h_{t-1}, y_t = eta . h_t
    a, d, b, e = (
        torch.tensor([[0.5, 0.25]], dtype=torch.float64),
        torch.tensor([[0.5, 1.0]], dtype=torch.float64),
        torch.tensor([[1.0, -2.0]], dtype=torch.float64),
        torch.tensor([[3.0, 1.0]], dtype=torch.float64),
    )
    x = torch.tensor([[[1.0], [2.0], [-1.0]]], dtype=torch.float64)
    q = 1 - a * d  # [0.75, 0.75]
    h, ys = torch.zeros(1, 2, dtype=torch.float64), []
    for t in range(3):
        h = a * b * x[0, t] + q * h
        ys.append(float((e * h).sum()))
    for backend in ("naive", "torch"):
        y = ema(x, a, d, b, e, causal=True, backend=backend)
        torch.testing.assert_close(y.flatten(), torch.tensor(ys, dtype=torch.float64))
    # the kernel is the impulse response: k[l] = sum_n eta a b q^l
    k = ema_kernel(a, d, b, e, 3)
    torch.testing.assert_close(k[0], torch.stack([(e * a * b * q**lag).sum() for lag in range(3)]))


def test_bidirectional_is_forward_plus_reversed_backward():
    x = torch.randn(2, 11, 3, dtype=torch.float64)
    a, d, b, e = _coeffs(3, 4, False, torch.float64)
    both = ema(x, a, d, b, e, causal=False)
    fwd = ema(x, a[0], d[0], b[0], e[0], causal=True)
    bwd = ema(x.flip(1), a[1], d[1], b[1], e[1], causal=True).flip(1)
    torch.testing.assert_close(both, fwd + bwd, atol=1e-12, rtol=1e-12)


def test_gradcheck_fft():
    x = torch.randn(1, 6, 2, dtype=torch.float64, requires_grad=True)
    coeffs = [c.requires_grad_() for c in _coeffs(2, 2, False, torch.float64)]
    assert torch.autograd.gradcheck(lambda *a: ema(*a, causal=False, backend="torch"), (x, *coeffs))


def test_saturated_rates_and_long_sequences_stay_finite():
    # alpha = delta = 1 (q = 0) and alpha = 0 (q = 1) are the limits a float32 sigmoid reaches
    x = torch.randn(1, 4096, 2)
    a = torch.tensor([[1.0, 0.0], [0.3, 1.0]])
    d = torch.tensor([[1.0, 0.5], [0.999, 1.0]])
    b, e = torch.ones(2, 2), torch.ones(2, 2)
    y = ema(x, a, d, b, e, causal=True)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[0, :, 0], x[0, :, 0])  # q = 0: y_t = a b x_t, nothing remembered


def test_bad_inputs_are_named():
    x = torch.randn(1, 5, 3)
    a, d, b, e = _coeffs(3, 2, True, torch.float32)
    with pytest.raises(ValueError, match=r"alpha must have shape \(2, D, h\)"):
        ema(x, a, d, b, e, causal=False)
    with pytest.raises(ValueError, match=r"with D=3"):
        ema(x, a[:2], d[:2], b[:2], e[:2], causal=True)
    with pytest.raises(ValueError, match=r"delta must lie in \[0, 1\]"):
        ema(x, a, d + 1.5, b, e, causal=True)
    with pytest.raises(ValueError, match="x must have shape"):
        ema(x[0], a, d, b, e, causal=True)
    with pytest.raises(ValueError, match="backend='fast' is not supported by ema; valid backends"):
        ema(x, a, d, b, e, causal=True, backend="fast")
    with pytest.raises(TypeError, match="causal must be a bool"):
        ema(x, a, d, b, e, causal=1)
    with pytest.raises(ValueError, match=r"state must be a tensor of shape \(B, D, h\) = \(1, 3, 2\)"):
        ema_step(x[:, :1], torch.zeros(1, 3, 5), a, d, b, e)
    bad = x.clone()
    bad[0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains non-finite"):
        ema(bad, a, d, b, e, causal=True)


def test_mixed_precision_keeps_the_kernel_in_float32():
    x = torch.randn(2, 9, 3)
    coeffs = _coeffs(3, 2, False, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ema(x, *coeffs)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ema(x, *coeffs), rtol=0, atol=0)


@pytest.mark.parametrize("n,block", [(1, 4), (7, 3), (12, 4), (13, 4), (13, 1), (13, 64)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_block_scan_matches_recurrence_forward_backward(n, block, dtype):
    # several blocks, a ragged last block, one-token blocks, one block holding everything
    x = torch.randn(2, n, 3, dtype=dtype, generator=torch.Generator().manual_seed(n))
    coeffs = _coeffs(3, 2, True, dtype, seed=block)
    ref = _fwd_bwd(x, coeffs, causal=True, backend="naive")
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, *coeffs)]
    y = ema_scan(*leaves, block=block)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape))
    for r, g in zip(ref, [y.detach()] + [t.grad for t in leaves], strict=True):
        torch.testing.assert_close(g, r, **TOL[dtype])


@pytest.mark.parametrize("t", [0, 3, 4, 9])
def test_block_scan_reads_no_future_token_across_blocks(t):
    # t at a block's end (3), its start (4) and inside one (9): not one bit of the past moves
    x = torch.randn(2, 13, 3, dtype=torch.float64)
    coeffs = _coeffs(3, 2, True, torch.float64)
    x2 = x.clone()
    x2[:, t + 1 :] += torch.randn_like(x2[:, t + 1 :])
    y, y2 = ema_scan(x, *coeffs, block=4), ema_scan(x2, *coeffs, block=4)
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=0)
    assert not torch.allclose(y2[:, t + 1 :], y[:, t + 1 :])


def test_block_scan_with_saturated_rates():
    # q = 0 (alpha = delta = 1) and q = 1 (alpha = 0): q^0 stays 1, nothing overflows
    x = torch.randn(1, 11, 2, dtype=torch.float64)
    a = torch.tensor([[1.0, 0.0], [0.3, 1.0]], dtype=torch.float64)
    d = torch.tensor([[1.0, 0.5], [0.999, 1.0]], dtype=torch.float64)
    b, e = torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64)
    torch.testing.assert_close(ema_scan(x, a, d, b, e, block=3), ema(x, a, d, b, e, causal=True, backend="naive"))
