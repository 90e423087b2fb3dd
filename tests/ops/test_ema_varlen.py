"""MEGA's EMA with padding masks and packed rows: the recurrence restarts at every sequence start."""

from __future__ import annotations

import pytest
import torch

from attnzoo.ops.ema import ema


def _coeffs(d, h, causal, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (d, h) if causal else (2, d, h)
    alpha, delta = torch.rand(shape, generator=g, dtype=dtype), torch.rand(shape, generator=g, dtype=dtype)
    beta, eta = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)
    return {"alpha": alpha, "delta": delta.clamp(0.05, 1.0) * 0.3, "beta": beta, "eta": eta}  # slow decay: leaks


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
