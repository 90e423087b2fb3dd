"""mssa with padding masks and packed rows: each sequence as if alone, every backend."""

import pytest
import torch

from attnzoo.ops.mssa import mssa


def test_mask_errors_are_clear():
    w = torch.randn(2, 1, 4, 3)
    with pytest.raises(ValueError, match="batch size 1, got B=2"):
        mssa(w, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="only 0/1"):
        mssa(w, attention_mask=torch.full((2, 4), 3))
