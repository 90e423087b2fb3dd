"""MEGA's EMA with padding masks and packed rows: the recurrence restarts at every sequence start."""

from __future__ import annotations

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.ema import ema


def _coeffs(d, h, causal, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (d, h) if causal else (2, d, h)
    alpha, delta = torch.rand(shape, generator=g, dtype=dtype), torch.rand(shape, generator=g, dtype=dtype)
    beta, eta = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)
    return {"alpha": alpha, "delta": delta.clamp(0.05, 1.0) * 0.3, "beta": beta, "eta": eta}  # slow decay: leaks


def _seqs(lengths, d=3, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(1, n, d, generator=g, dtype=dtype)} for n in lengths]


def _call(causal, backend):
    def call(x, alpha, delta, beta, eta, attention_mask=None, cu_seqlens=None):
        return ema(
            x,
            alpha,
            delta,
            beta,
            eta,
            causal=causal,
            backend=backend,
            attention_mask=attention_mask,
            cu_seqlens=cu_seqlens,
        )

    return call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["naive", "torch", "auto"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [[5, 1, 7, 3], [1], [6, 2]])
def test_equal_to_alone_float64(lengths, causal, backend, mode):
    shared = _coeffs(3, 4, causal, torch.float64)
    assert_equal_to_alone(_call(causal, backend), _seqs(lengths), {"x": 1}, mode=mode, shared=shared, out_axis=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [True, False])
def test_equal_to_alone_float32(causal, mode):
    shared = _coeffs(3, 4, causal, torch.float32)
    seqs = _seqs([9, 1, 6], dtype=torch.float32)
    assert_equal_to_alone(
        _call(causal, "torch"), seqs, {"x": 1}, mode=mode, shared=shared, out_axis=1, rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_causal_restart_does_not_leak(backend):
    # changing an earlier packed sequence must not change a later one, nor a later token an earlier one
    c = _coeffs(3, 4, True, torch.float64)
    x = torch.randn(1, 8, 3, dtype=torch.float64)
    cu = torch.tensor([0, 3, 8])
    y = ema(x, *c.values(), causal=True, backend=backend, cu_seqlens=cu)
    x2 = x.clone()
    x2[:, :3] += 10.0
    x2[:, 7] += 10.0
    y2 = ema(x2, *c.values(), causal=True, backend=backend, cu_seqlens=cu)
    torch.testing.assert_close(y2[:, 3:7], y[:, 3:7], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(y2[:, :3], y[:, :3])


@pytest.mark.parametrize("causal", [False, True])
def test_holed_mask_equals_the_real_tokens_alone(causal):
    # padding between real tokens (a CLS token before left padding, say): the FFT path moves the real tokens
    # together and back, forward and backward
    c = _coeffs(3, 4, causal, torch.float64)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 0, 0]])
    ref = ema(x, *c.values(), causal=causal, backend="naive", attention_mask=mask)
    alone = ema(x[:1, [0, 2, 3]], *c.values(), causal=causal, backend="naive")
    torch.testing.assert_close(ref[:1, [0, 2, 3]], alone, rtol=1e-12, atol=1e-12)
    got = ema(x, *c.values(), causal=causal, backend="torch", attention_mask=mask)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-11)
    g = torch.randn_like(ref)
    torch.testing.assert_close(*(torch.autograd.grad(y, x, g)[0] for y in (got, ref)), rtol=1e-10, atol=1e-11)
