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


def test_contiguous_runs_of_packed_rows_padded_rows_and_none_for_holes():
    from attnzoo.ops._segment_ops import contiguous_runs

    packed = segments(1, 6, cu_seqlens=torch.tensor([0, 1, 4, 6], dtype=torch.int32))
    assert contiguous_runs(packed, 64) == [(0, 0, 1), (0, 1, 4), (0, 4, 6)]
    assert contiguous_runs(packed, 2) is None  # more sequences than allowed
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    assert contiguous_runs(segments(3, 5, attention_mask=mask), 64) == [(0, 0, 3), (1, 2, 5)]
    assert contiguous_runs(segments(1, 5, attention_mask=torch.tensor([[1, 0, 1, 0, 0]])), 64) is None


def _runs_reference(fn, runs, tensors, out_dim):
    """The definition of run_runs by indexing under autograd."""
    x = tensors[0]
    out = x.new_zeros(*x.shape[:3], out_dim)
    for b, a, e in runs:
        out[b : b + 1, :, a:e] = fn(*(t[b : b + 1, :, a:e] for t in tensors))
    return out


def test_run_runs_equals_indexing_forward_and_backward_and_zero_outside():
    from attnzoo.ops._segment_ops import _run_runs_functional, run_runs

    g = torch.Generator().manual_seed(3)
    x = (1e3 * torch.randn(3, 2, 9, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    y = torch.randn(3, 2, 9, 2, generator=g, dtype=torch.float64).requires_grad_(True)
    unused = torch.randn(3, 2, 9, 1, generator=g, dtype=torch.float64).requires_grad_(True)
    # several runs in a row, gaps at both ends and between them, an empty row, a full row
    runs = [(0, 1, 3), (0, 3, 4), (0, 6, 8), (2, 0, 9)]

    def fn(a, b, _):
        return torch.cat([a.cumsum(dim=2), b * b.sum(dim=2, keepdim=True)], dim=-1)

    cot = torch.randn(3, 2, 9, 6, generator=g, dtype=torch.float64)
    want = _runs_reference(fn, runs, (x, y, unused), 6)
    want_grads = torch.autograd.grad((want * cot).sum(), (x, y))
    for form in (run_runs, _run_runs_functional):
        got = form(fn, runs, (x, y, unused), 6)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        gx, gy, gu = torch.autograd.grad((got * cot).sum(), (x, y, unused), allow_unused=True)
        torch.testing.assert_close(gx, want_grads[0], rtol=1e-15, atol=0)
        torch.testing.assert_close(gy, want_grads[1], rtol=1e-15, atol=0)
        assert gu is None or bool((gu == 0).all())
        outside = torch.ones(3, 9, dtype=torch.bool)
        for b, a, e in runs:
            outside[b, a:e] = False
        assert bool((got.transpose(1, 2)[outside] == 0).all()) and bool((gx.transpose(1, 2)[outside] == 0).all())
    with torch.no_grad():
        torch.testing.assert_close(run_runs(fn, runs, (x, y, unused), 6), want, rtol=0, atol=0)
