"""TSSA with padding masks and packed rows (issue 27): every backend that takes them equals each sequence alone,
forward and backward; the causal bias is read at the position within each sequence; bad input is refused."""

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.tssa import tssa, tssa_pi

MASKED = ["naive", "torch"]
# 1 token, odd lengths, and 300/77 across the scan chunk (32 at N=300, 16 below) with ragged last chunks
LENGTHS = [[1, 5, 3], [7, 1], [300, 77, 33]]


def _seqs(lengths, dtype, h=3, p=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(1, h, 1, p, generator=g, dtype=torch.float64))
    return [{"w": (torch.randn(1, h, n, p, generator=g, dtype=torch.float64) * scale).to(dtype)} for n in lengths]


def _shared(lengths, dtype, causal, h=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    shared = {"temp": (0.5 + 2 * torch.rand(h, generator=g, dtype=torch.float64)).to(dtype)}
    if causal:
        shared["bias"] = (0.3 * torch.randn(h, max(lengths) + 2, 1, generator=g, dtype=torch.float64)).to(dtype)
    return shared


@pytest.mark.parametrize("backend", MASKED)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equal_to_alone_float64(backend, causal, mode, lengths):
    def call(**kw):
        return tssa(causal=causal, backend=backend, **kw)

    assert_equal_to_alone(call, _seqs(lengths, torch.float64), {"w": 2}, mode=mode, shared=_shared(lengths, torch.float64, causal))


@pytest.mark.parametrize("backend", MASKED + ["auto"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_equal_to_alone_float32(backend, causal, mode):
    lengths = [40, 1, 17]

    def call(**kw):
        return tssa(causal=causal, backend=backend, **kw)

    assert_equal_to_alone(
        call,
        _seqs(lengths, torch.float32),
        {"w": 2},
        mode=mode,
        shared=_shared(lengths, torch.float32, causal),
        rtol=2e-4,
        atol=2e-5,
    )
