"""TSSA with padding masks and packed rows: every backend that takes them equals each sequence alone,
forward and backward; the causal bias is read at the position within each sequence; bad input is refused."""

import pytest
import torch
from conftest import mask_backends

from attnzoo.ops.tssa import TSSA, tssa, tssa_init_state, tssa_pi, tssa_step

# the fused CPU kernels take them through a task table of runs of real tokens
MASKED = mask_backends(TSSA)


@pytest.mark.parametrize("backend", MASKED)
def test_causal_bias_is_read_at_the_position_within_the_sequence(backend):
    # the second packed sequence starts at row index 4 but position 0: it must see bias[:, 0], not bias[:, 4]
    w = torch.randn(1, 2, 6, 3, dtype=torch.float64)
    temp = torch.ones(2, dtype=torch.float64)
    bias = torch.zeros(2, 6, 1, dtype=torch.float64)
    bias[0, 4:] = 5.0  # only read at positions >= 4, which the sequences (4 and 2 tokens) never reach
    cu = torch.tensor([0, 4, 6])
    got = tssa(w, temp, causal=True, bias=bias, cu_seqlens=cu, backend=backend)
    want = tssa(w, temp, causal=True, bias=torch.zeros_like(bias), cu_seqlens=cu, backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_all_padding_row_gives_zeros():
    w = torch.randn(2, 2, 5, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 0, 0, 0, 0]])
    for causal in (False, True):
        out = tssa(w, torch.ones(2, dtype=torch.float64), causal=causal, attention_mask=mask, backend="torch")
        assert bool((out[1] == 0).all()) and bool(torch.isfinite(out).all())
        pi = tssa_pi(w, torch.ones(2, dtype=torch.float64), causal=causal, attention_mask=mask)
        assert bool((pi[1] == 0).all()) and bool((pi[0, :, 2] == 0).all())


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_kernels_long_sequences_span_several_tasks(causal):
    # 1100 and 600 tokens: several 512-token tasks per sequence, a gap of padding in the middle of a row
    g = torch.Generator().manual_seed(9)
    w = torch.randn(2, 3, 1200, 16, generator=g, dtype=torch.float64, requires_grad=True)
    temp = torch.tensor([0.6, 1.3, 2.2], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 1200, dtype=torch.bool)
    mask[0, 1100:] = False
    mask[1, 300:900] = False
    bias = (0.3 * torch.randn(3, 1100, 1, generator=g, dtype=torch.float64)).requires_grad_(causal)
    _assert_cpu_equals_torch(w, temp, bias, causal, g, attention_mask=mask)


def _assert_cpu_equals_torch(w, temp, bias, causal: bool, g: torch.Generator, **masks) -> None:
    """The fused CPU kernels against the PyTorch path on the same masked call, forward and backward (float64)."""
    kw = {"causal": causal, "bias": bias if causal else None, **masks}
    outs = [tssa(w, temp, backend=b, **kw) for b in ("cpu", "torch")]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-12)
    cot = torch.randn(outs[0].shape, generator=g, dtype=torch.float64)
    leaves = (w, temp, bias) if causal else (w, temp)
    grads = [torch.autograd.grad((o * cot).sum(), leaves) for o in outs]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bad_masks_raise():
    w, temp = torch.randn(2, 2, 5, 3), torch.ones(2)
    with pytest.raises(ValueError, match=r"shape \(B, N\)"):
        tssa(w, temp, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch size 1"):
        tssa(w, temp, cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="not both"):
        tssa(w[:1], temp, attention_mask=torch.ones(1, 5), cu_seqlens=torch.tensor([0, 5]))
    # the causal bias must cover the longest sequence (not the packed row)
    bias = torch.zeros(2, 3, 1)
    tssa(w[:1], temp, causal=True, bias=bias, cu_seqlens=torch.tensor([0, 3, 5]))
    with pytest.raises(ValueError, match="longest sequence has N=4"):
        tssa(w[:1], temp, causal=True, bias=bias, cu_seqlens=torch.tensor([0, 4, 5]))


def test_decoding_a_left_padded_prompt_equals_each_prompt_alone():
    g = torch.Generator().manual_seed(7)
    lengths, h, p = [6, 2, 4], 2, 3
    temp = torch.tensor([0.8, 1.7], dtype=torch.float64)
    bias = 0.3 * torch.randn(h, 8, 1, generator=g, dtype=torch.float64)
    seqs = [torch.randn(1, h, n, p, generator=g, dtype=torch.float64) for n in lengths]
    width = max(lengths)
    w = 1e3 * torch.randn(len(lengths), h, width, p, generator=g, dtype=torch.float64)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        w[i, :, width - s.shape[2] :] = s[0]
        mask[i, width - s.shape[2] :] = True
    state = tssa_init_state(len(lengths), h, p, dtype=torch.float64)
    outs = []
    for t in range(width):
        o, state = tssa_step(w[:, :, t], temp, state, bias=bias, attention_mask=mask[:, t])
        outs.append(o)
    got = torch.stack(outs, dim=2)
    assert state.pos.tolist() == lengths
    torch.testing.assert_close(got, tssa(w, temp, causal=True, bias=bias, attention_mask=mask), rtol=1e-12, atol=1e-12)
    for i, s in enumerate(seqs):
        alone = tssa(s, temp, causal=True, bias=bias, backend="naive")
        torch.testing.assert_close(got[i : i + 1, :, width - s.shape[2] :], alone, rtol=1e-12, atol=1e-12)
    assert bool((got[~mask.unsqueeze(1).expand(-1, h, -1)] == 0).all())
    with pytest.raises(ValueError, match=r"shape \(B,\)"):
        tssa_step(w[:, :, 0], temp, state, bias=bias, attention_mask=mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", MASKED)
def test_all_padding_row_and_holes_give_zeros_in_every_backend(backend, causal):
    # the CPU kernels write only the tasks' tokens and zero the rest (a whole row without real tokens, a hole,
    # both ends): no uninitialised memory may show there, in the output or in the gradient
    g = torch.Generator().manual_seed(4)
    w = (1e3 * torch.randn(3, 2, 9, 3, generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0], [0] * 9, [1] * 9], dtype=torch.bool)
    temp = torch.ones(2, dtype=torch.float64)
    out = tssa(w, temp, causal=causal, attention_mask=mask, backend=backend)
    ref = tssa(w, temp, causal=causal, attention_mask=mask, backend="naive")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    assert bool((out.transpose(1, 2)[~mask] == 0).all())
    (grad,) = torch.autograd.grad((out * torch.randn(out.shape, generator=g, dtype=torch.float64)).sum(), w)
    assert bool((grad.transpose(1, 2)[~mask] == 0).all()) and bool(torch.isfinite(grad).all())


@pytest.mark.parametrize("mode", ["right", "packed"])
def test_cpu_non_causal_finds_nan_in_real_tokens_only(mode):
    # the masked non-causal kernels find NaN/Inf in w from their per-sequence sums of w^2 (no separate pass)
    from attnzoo._checks import NonFiniteError

    w = torch.randn(2 if mode == "right" else 1, 2, 6, 3, dtype=torch.float64)
    kw = (
        {"attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6], dtype=torch.bool)}
        if mode == "right"
        else {"cu_seqlens": torch.tensor([0, 4, 6], dtype=torch.int32)}
    )
    if mode == "right":
        w[0, :, 5] = float("nan")  # padding: ignored
        assert bool(torch.isfinite(tssa(w, torch.ones(2, dtype=torch.float64), backend="cpu", **kw)).all())
    w[0, 1, 2, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="w"):
        tssa(w, torch.ones(2, dtype=torch.float64), backend="cpu", **kw)


def _random_masks(g: torch.Generator) -> list[torch.Tensor]:
    """Left/right padding, holes, single real tokens, empty and full rows, lengths across several 512-token tasks."""
    masks = [
        torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0], [0] * 9, [1] * 9, [0, 0, 0, 0, 1, 0, 0, 0, 0]], dtype=torch.bool),
        torch.ones(1, 1, dtype=torch.bool),
    ]
    for n in (1, 511, 512, 513, 1300, 2100):
        for p_real in (0.5, 0.97):
            holed = torch.rand(3, n, generator=g) < p_real
            lengths = torch.randint(0, n + 1, (3,), generator=g)
            left = torch.arange(n)[None, :] >= n - lengths[:, None]
            right = torch.arange(n)[None, :] < lengths[:, None]
            masks.append(torch.cat([holed, left, right]))
    return masks


def _random_offsets(g: torch.Generator) -> list[list[int]]:
    out = [[1], [512], [513, 1, 511], [1, 1, 1], [1024, 1535, 7]]
    for _ in range(6):
        lengths = torch.randint(1, 1400, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        out.append(lengths)
    return out


def test_fast_task_tables_equal_the_vectorised_builder():
    # the kernels' table from a mask (one C++ scan) or from offsets (host integers) against the one from ids/pos
    from attnzoo.ops import _cpu_kernels
    from attnzoo.ops._varlen import segments
    from attnzoo.ops.tssa.chunk import varlen_tasks, varlen_tasks_vectorised

    kernels = _cpu_kernels.required_cpu_kernels()
    g = torch.Generator().manual_seed(11)
    for mask in _random_masks(g):
        seg = segments(*mask.shape, attention_mask=mask)
        fast, ref = varlen_tasks(seg, kernels), varlen_tasks_vectorised(seg)
        assert torch.equal(fast.table, ref.table) and fast.slots == ref.slots
    for lengths in _random_offsets(g):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        seg = segments(1, sum(lengths), cu_seqlens=cu)
        fast, ref = varlen_tasks(seg, kernels), varlen_tasks_vectorised(seg)
        assert torch.equal(fast.table, ref.table) and fast.slots == ref.slots


def _slot_of_tokens(seg) -> torch.Tensor:
    """``(B, N)``: each real token's slot (row * S + sequence id), -1 at padding: the definition the tables follow."""
    rows = torch.arange(seg.ids.shape[0])[:, None] * seg.num
    return torch.where(seg.real, rows + seg.ids, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_slot_sum_and_read_follow_each_tokens_sequence(dtype):
    # the varlen backward's per-sequence sums and reads against sums over each token's slot, for tables from a
    # mask, from offsets and from ids; padding is never read and reads 1
    from attnzoo.ops import _cpu_kernels
    from attnzoo.ops._varlen import segments
    from attnzoo.ops.tssa.chunk import varlen_tasks, varlen_tasks_vectorised

    kernels = _cpu_kernels.required_cpu_kernels()
    g = torch.Generator().manual_seed(12)
    segs = [segments(*m.shape, attention_mask=m) for m in _random_masks(g)]
    for lengths in _random_offsets(g):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        segs.append(segments(1, sum(lengths), cu_seqlens=cu))
    for seg in segs:
        b_n, n = seg.ids.shape
        slot = _slot_of_tokens(seg)
        for vt in (varlen_tasks(seg, kernels), varlen_tasks_vectorised(seg)):
            x = torch.randn(b_n, 3, n, dtype=dtype, generator=g)
            want = torch.zeros(vt.slots + 1, 3, dtype=torch.float64)
            want.index_add_(0, slot.where(slot >= 0, vt.slots).reshape(-1), x.double().transpose(1, 2).reshape(-1, 3))
            x = torch.where(seg.real[:, None], x, torch.full((), float("nan"), dtype=dtype))  # padding is never read
            got = kernels.tssa_slot_sum(x, vt.table, vt.slots)
            assert got.dtype == dtype and got.shape == (vt.slots, 3)
            torch.testing.assert_close(got.double(), want[:-1], rtol=1e-6, atol=1e-4)
            stat = torch.randn(vt.slots, 3, dtype=dtype, generator=g)
            ext = torch.cat([stat, torch.ones(1, 3, dtype=dtype)])  # padding reads 1
            expect = ext[slot.where(slot >= 0, vt.slots)].permute(0, 2, 1)
            assert torch.equal(kernels.tssa_slot_read(stat, vt.table, b_n, n, 1.0), expect)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_kernels_long_packed_sequences_span_several_tasks(causal):
    # a packed row whose sequences cross 512-token task boundaries (and one of a single token)
    g = torch.Generator().manual_seed(10)
    lengths = [700, 1, 1100, 513]
    _check_cpu_packed_against_torch(lengths, causal, g)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_kernels_packed_row_of_many_sequences(causal):
    # more sequences than the backward reads slice by slice: per-token slots
    g = torch.Generator().manual_seed(12)
    lengths = torch.randint(1, 40, (70,), generator=g).tolist()
    _check_cpu_packed_against_torch(lengths, causal, g)


def _check_cpu_packed_against_torch(lengths: list[int], causal: bool, g: torch.Generator) -> None:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    w = torch.randn(1, 3, sum(lengths), 16, generator=g, dtype=torch.float64, requires_grad=True)
    temp = torch.tensor([0.6, 1.3, 2.2], dtype=torch.float64, requires_grad=True)
    bias = (0.3 * torch.randn(3, max(lengths), 1, generator=g, dtype=torch.float64)).requires_grad_(causal)
    _assert_cpu_equals_torch(w, temp, bias, causal, g, cu_seqlens=cu)
