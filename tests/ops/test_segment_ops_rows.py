"""row_spans / run_rows (issue 27): which padded batches run row by row, and that the rest is zero."""

import torch

from attnzoo.ops._segment_ops import row_spans, run_rows
from attnzoo.ops._varlen import segments


def test_row_spans_of_left_right_and_empty_rows_and_none_for_holes_or_packed():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]])
    assert row_spans(segments(5, 5, attention_mask=mask)) == [(0, 3), (2, 5), (0, 0), (0, 5), (1, 2)]
    holed = torch.tensor([[1, 0, 1, 0, 0]])
    assert row_spans(segments(1, 5, attention_mask=holed)) is None
    packed = segments(1, 5, cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32))
    assert row_spans(packed) is None


def test_run_rows_zero_padding_and_exact_zero_gradient():
    x = (1e3 * torch.randn(3, 2, 6, 4, dtype=torch.float64)).requires_grad_(True)
    spans = [(1, 4), (0, 0), (0, 6)]
    out = run_rows(lambda t: t.cumsum(dim=2), spans, (x,), 4)
    want = torch.zeros_like(out)
    want[0, :, 1:4] = x[0, :, 1:4].cumsum(dim=1)
    want[2] = x[2].cumsum(dim=1)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert bool((g[0, :, [0, 4, 5]] == 0).all()) and bool((g[1] == 0).all()) and bool((g[0, :, 1:4] != 0).all())
