"""MEGA attention with padding masks and packed rows: within each sequence, chunks from its start."""

from __future__ import annotations

import pytest
import torch

from attnzoo.layers.mega import MegaLayer
from attnzoo.ops.mega import mega_attention


def test_bias_must_cover_the_longest_sequence():
    q = torch.randn(1, 9, 3)
    cu = torch.tensor([0, 3, 9])
    mega_attention(q, q, q, torch.randn(11), cu_seqlens=cu)  # R = 6 covers sequences of 3 and 6
    with pytest.raises(ValueError, match=r"R >= 6"):
        mega_attention(q, q, q, torch.randn(9), cu_seqlens=cu)


def test_layer_errors_with_masks():
    x, mask = torch.randn(2, 4, 6), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="batchnorm"):
        MegaLayer(6, 1, norm_layer="batchnorm").train()(x, attention_mask=mask)
    with pytest.raises(ValueError, match="needs N divisible by csp_groups, got N=3"):
        MegaLayer(6, 1, attention="csp", csp_groups=2)(x, attention_mask=mask)
