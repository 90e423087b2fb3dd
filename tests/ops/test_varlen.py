"""The padding-mask and packed-sequence conventions (ops/_varlen.py): segments, positions and clear errors."""

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops._varlen import segments


def test_left_right_and_holed_padding_give_positions_counted_over_real_tokens():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]])
    seg = segments(3, 5, attention_mask=mask)
    assert seg.ids.tolist() == [[-1, -1, 0, 0, 0], [0, 0, 0, -1, -1], [0, -1, 0, 0, -1]]
    assert seg.pos.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0], [0, 0, 1, 2, 0]]
    assert seg.lengths.tolist() == [[3], [3], [3]] and seg.num == 1
    assert [(b, i.tolist()) for b, i in seg.sequences()] == [(0, [2, 3, 4]), (1, [0, 1, 2]), (2, [0, 2, 3])]
    # bool, integer and float masks mean the same
    for m in (mask.bool(), mask.float(), mask.to(torch.int32)):
        assert torch.equal(segments(3, 5, attention_mask=m).ids, seg.ids)


def test_a_row_without_real_tokens_has_no_sequence():
    seg = segments(2, 3, attention_mask=torch.tensor([[0, 0, 0], [1, 1, 0]]))
    assert seg.ids.tolist() == [[-1, -1, -1], [0, 0, -1]] and seg.lengths.tolist() == [[0], [2]]
    assert [b for b, _ in seg.sequences()] == [1]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_packed_offsets_give_sequence_ids_and_positions(dtype):
    seg = segments(1, 7, cu_seqlens=torch.tensor([0, 1, 4, 7], dtype=dtype))
    assert seg.ids.tolist() == [[0, 1, 1, 1, 2, 2, 2]]
    assert seg.pos.tolist() == [[0, 0, 1, 2, 0, 1, 2]]
    assert seg.lengths.tolist() == [[1, 3, 3]] and seg.num == 3
    assert bool(seg.real.all())


def test_neither_keyword_is_no_segments():
    assert segments(2, 4) is None


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(attention_mask=torch.ones(2, 4)), ValueError, r"shape \(B, N\) = \(2, 5\).*got \(2, 4\)"),
        (dict(attention_mask=torch.ones(2, 5, 1)), ValueError, r"shape \(B, N\) = \(2, 5\)"),
        (dict(attention_mask=torch.full((2, 5), 2)), ValueError, r"only 0/1.*\[2, 2, 2\]"),
        (dict(attention_mask=[[1] * 5] * 2), TypeError, "must be a \\(B, N\\)"),
        (dict(cu_seqlens=torch.tensor([0, 5])), ValueError, "batch size 1, got B=2"),
    ],
)
def test_bad_masks_are_clear_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        segments(2, 5, **kwargs)


@pytest.mark.parametrize(
    "cu,err,match",
    [
        (torch.tensor([1, 3, 6]), ValueError, "must start at 0, got 1"),
        (torch.tensor([0, 3, 3, 6]), ValueError, "strictly increasing.*got 3 then 3 at index 1"),
        (torch.tensor([0, 4, 2, 6]), ValueError, "strictly increasing.*got 4 then 2"),
        (torch.tensor([0, 3, 5]), ValueError, "must end at the row's length T=6, got 5"),
        (torch.tensor([0.0, 6.0]), TypeError, "int32 or int64, got dtype torch.float32"),
        (torch.tensor([[0, 6]]), ValueError, "must be 1-D"),
        (torch.tensor([0]), ValueError, "must be 1-D with S \\+ 1 >= 2"),
    ],
)
def test_bad_offsets_are_clear_errors(cu, err, match):
    with pytest.raises(err, match=match):
        segments(1, 6, cu_seqlens=cu)


def test_mask_and_offsets_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        segments(1, 3, attention_mask=torch.ones(1, 3), cu_seqlens=torch.tensor([0, 3]))


# ----------------------------------------------------------------------------------------------- the harness
def _segment_mean(x, attention_mask=None, cu_seqlens=None, ignore_segments=False):
    """x (B, H, N, P) -> every token gets the mean of its sequence's tokens (a toy op that honours segments)."""
    seg = segments(x.shape[0], x.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens)
    if seg is None or ignore_segments:
        return x.mean(2, keepdim=True).expand_as(x)
    onehot = torch.nn.functional.one_hot(seg.ids.clamp_min(0), seg.num).to(x.dtype) * seg.real[..., None]
    sums = torch.einsum("bns,bhnp->bhsp", onehot, x)
    means = sums / seg.lengths.clamp_min(1)[:, None, :, None].to(x.dtype)
    return torch.einsum("bns,bhsp->bhnp", onehot, means)


@pytest.mark.parametrize("mode", MODES)
def test_the_harness_passes_an_op_that_honours_segments_and_fails_one_that_does_not(mode):
    gen = torch.Generator().manual_seed(1)
    seqs = [{"x": torch.randn(1, 2, n, 3, generator=gen, dtype=torch.float64)} for n in (1, 4, 7)]
    assert_equal_to_alone(_segment_mean, seqs, {"x": 2}, mode=mode)
    with pytest.raises(AssertionError):
        assert_equal_to_alone(
            lambda **kw: _segment_mean(**kw, ignore_segments="attention_mask" in kw or "cu_seqlens" in kw),
            seqs,
            {"x": 2},
            mode=mode,
        )
