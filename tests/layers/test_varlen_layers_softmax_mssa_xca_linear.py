"""Layers with padding masks and packed rows: softmax, MSSA, XCA and linear attention modules give, at
each real token, what each sequence gives alone (forward and input gradients), and zeros at padding."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from varlen_cases import MODES, assert_equal_to_alone  # noqa: E402

from attnzoo.layers import build_attention  # noqa: E402
from attnzoo.layers.base import capture_internals  # noqa: E402

DIM, HEADS = 8, 2
CASES = [
    ("softmax", False, {}),
    ("softmax", True, {}),
    ("mssa", False, {}),
    ("mssa", True, {"normalize_query": True, "out_proj": False}),
    ("xca", False, {}),
    ("linear", False, {}),
    ("linear", True, {"chunk_size": 3}),
]


def _layer(name, causal, opts):
    torch.manual_seed(0)
    return build_attention(name, DIM, HEADS, causal=causal, **opts).double().eval()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,causal,opts", CASES)
def test_layer_equal_to_alone(name, causal, opts, mode):
    layer = _layer(name, causal, opts)
    assert layer.supports_masks
    gen = torch.Generator().manual_seed(1)
    seqs = [{"x": torch.randn(1, n, DIM, generator=gen, dtype=torch.float64)} for n in (1, 5, 8)]
    assert_equal_to_alone(lambda **kw: layer(kw.pop("x"), **kw), seqs, {"x": 1}, mode=mode, out_axis=1)


@pytest.mark.parametrize("name,causal,opts", CASES)
def test_capture_with_a_mask_runs_and_matches(name, causal, opts):
    layer = _layer(name, causal, opts)
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    plain = layer(x, attention_mask=mask)
    with capture_internals(layer) as rec:
        captured = layer(x, attention_mask=mask)
    torch.testing.assert_close(captured, plain, rtol=1e-10, atol=1e-11)
    (attn,) = (r["attn"] for r in rec.values())
    if name == "xca":  # one (P, P) map per row, from that row's real tokens alone
        with capture_internals(layer) as rec1:
            layer(x[:1, 2:])
        (want,) = (r["attn"] for r in rec1.values())
        torch.testing.assert_close(attn[:1], want, rtol=1e-10, atol=1e-11)
    else:  # (B, H, N, N): padding queries and padding keys carry no weight
        assert bool((attn[0, :, :2] == 0).all()) and bool((attn[0, :, :, :2] == 0).all())
        assert bool((attn[1, :, 5] == 0).all()) and bool((attn[1, :, :, 5] == 0).all())
