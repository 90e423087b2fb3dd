"""CSP with padding masks and packed rows: shifts and group sorts within each sequence, as if alone."""

from __future__ import annotations

import pytest
import torch
from conftest import mask_backends
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.csp import CSP, csp

SHIFTS = torch.tensor([0, 3, 11, 1, 7])  # larger than some lengths: each taken modulo the sequence's own length


def _seqs(lengths, c=5, dtype=torch.float64, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        v = torch.randn(1, n, c, generator=g, dtype=dtype)
        out.append({"v": v.round() if ties else v})  # rounded values tie often: the tie rule must match
    return out


def test_lengths_not_divisible_by_groups_are_an_error_as_alone():
    v = torch.randn(1, 7, 5)
    with pytest.raises(ValueError, match="groups"):
        csp(v[:, :3], SHIFTS, 2)  # alone
    with pytest.raises(ValueError, match=r"split into groups=2 equal groups.*\[3\]"):
        csp(v, SHIFTS, 2, cu_seqlens=torch.tensor([0, 4, 7]))


def _kernel_vs_naive(groups, shifts=SHIFTS):
    # the masked call is the fused kernel's; each sequence alone is the naive definition (explicit N x N matrices)
    def call(v, attention_mask=None, cu_seqlens=None):
        masked = attention_mask is not None or cu_seqlens is not None
        backend = "cpu" if masked else "naive"
        out = csp(v, shifts, groups, backend=backend, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
        if masked:
            assert "CSPVarlenKernel" in type(out.grad_fn).__name__  # the kernel ran, not the PyTorch path
        return out

    return call


# every group size the kernel meets: G = L / groups of 1 (groups=None, or groups = L), 2 (compare-and-swap), 3-16
# (insertion sort) and > 16 (std::stable_sort); lengths 1 and odd, sequences of different group sizes side by side
KERNEL_CASES = [
    (None, [5, 1, 7, 3]),
    (1, [5, 1, 7, 3]),
    (1, [19, 2, 1]),
    (2, [6, 2, 8, 4]),
    (3, [9, 3, 6]),
    (3, [3, 3]),
    (4, [16, 4, 12]),
    (2, [2, 10]),
    (5, [5, 35]),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("groups,lengths", KERNEL_CASES)
def test_cpu_kernel_equal_to_naive_alone(groups, lengths, ties, dtype, mode):
    seqs = _seqs(lengths, dtype=dtype, ties=ties)
    tol = dict(rtol=0, atol=0)  # values are only moved, forward and backward
    assert_equal_to_alone(_kernel_vs_naive(groups), seqs, {"v": 1}, mode=mode, out_axis=1, **tol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("groups,lengths", [(260, [520, 260]), (257, [771, 257]), (None, [300, 5])])
def test_cpu_kernel_long_sequences_equal_to_naive_alone(groups, lengths, mode):
    # longer than a block of the kernel (256 slots): several blocks, the last one partial, shifts crossing them
    seqs = _seqs(lengths, seed=4)
    shifts = torch.tensor([0, 300, 11, 129, 7])
    assert_equal_to_alone(_kernel_vs_naive(groups, shifts), seqs, {"v": 1}, mode=mode, out_axis=1, rtol=0, atol=0)


@pytest.mark.parametrize("groups", [None, 1, 2, 3])
def test_cpu_kernel_per_sequence_shifts_and_wide_channels(groups):
    # C = 37 spans three channel tiles of 16 (one partial); shifts of every size, one schedule per sequence
    g = torch.Generator().manual_seed(5)
    lengths = [12, 6, 3] if groups in (None, 1, 3) else [12, 6, 2]
    seqs = _seqs(lengths, c=37, seed=1)
    shifts = torch.randint(0, 50, (len(lengths), 37), generator=g)
    v = torch.cat([s["v"] for s in seqs], 1).requires_grad_(True)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    out = csp(v, shifts[None], groups, backend="cpu", cu_seqlens=cu)
    cot = torch.randn(out.shape, generator=g, dtype=out.dtype)
    (grad,) = torch.autograd.grad((out * cot).sum(), v)
    for i, s in enumerate(seqs):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        alone = s["v"].clone().requires_grad_(True)
        want = csp(alone, shifts[i], groups if groups is not None else lengths[i], backend="naive")
        torch.testing.assert_close(out[:, sl], want, rtol=0, atol=0)
        (want_grad,) = torch.autograd.grad((want * cot[:, sl]).sum(), alone)
        torch.testing.assert_close(grad[:, sl], want_grad, rtol=0, atol=0)


def test_cpu_kernel_serves_every_group_size_and_holed_masks():
    v = torch.randn(1, 10, 5, dtype=torch.float64)
    for cu, groups in [([0, 2, 10], 2), ([0, 4, 10], 2), ([0, 3, 10], 1), ([0, 9, 10], None)]:
        got = csp(v, SHIFTS, groups, backend="cpu", cu_seqlens=torch.tensor(cu))
        want = csp(v, SHIFTS, groups, backend="naive", cu_seqlens=torch.tensor(cu))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    holed = torch.tensor([[1, 0, 1, 1, 1, 0, 0, 1, 0, 1]])
    for groups in (None, 1, 2, 3, 6):
        got = csp(v.requires_grad_(True), SHIFTS, groups, backend="cpu", attention_mask=holed)
        assert "CSPVarlenKernel" in type(got.grad_fn).__name__
        torch.testing.assert_close(got, csp(v, SHIFTS, groups, backend="naive", attention_mask=holed), rtol=0, atol=0)


def test_cpu_kernel_refuses_non_finite_values_and_bad_arguments():
    v = torch.randn(2, 6, 3)
    v[1, 5, 2] = float("nan")  # padding too: every backend checks the whole of v
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match="csp"):
        csp(v, [0, 1, 2], 1, backend="cpu", attention_mask=mask)
    from attnzoo.ops import _cpu_kernels

    k = _cpu_kernels.required_cpu_kernels()
    seg = torch.tensor([[[0, 4]], [[0, 5]]])
    steps = torch.zeros(2, 1, 3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="length 5 cannot be split into groups = 2"):
        k.csp_varlen(torch.randn(2, 6, 3), seg, torch.empty(0, dtype=torch.long), steps, 2)
    with pytest.raises(RuntimeError, match=r"shifts must lie in \[0, length\) = \[0, 4\), got 4"):
        k.csp_varlen(torch.randn(2, 6, 3), seg, torch.empty(0, dtype=torch.long), steps + 4, 1)


@pytest.mark.parametrize("backend", mask_backends(CSP, reference=False))
@pytest.mark.parametrize("groups", [1, 2, 4, None])
def test_masks_with_holes(backend, groups):
    v = torch.randn(2, 7, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 1, 1, 0]])
    want = csp(v, SHIFTS, groups, backend="naive", attention_mask=mask)
    torch.testing.assert_close(csp(v, SHIFTS, groups, backend=backend, attention_mask=mask), want, rtol=0, atol=0)
    alone = csp(v[:1, [0, 2, 3, 5]], SHIFTS, groups)
    torch.testing.assert_close(want[:1, [0, 2, 3, 5]], alone, rtol=0, atol=0)


def test_per_sequence_shifts():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(1, 4, 5, generator=g), torch.randn(1, 6, 5, generator=g)
    sa, sb = torch.randint(0, 9, (5,), generator=g), torch.randint(0, 9, (5,), generator=g)
    out = csp(torch.cat([a, b], 1), torch.stack([sa, sb])[None], 2, cu_seqlens=torch.tensor([0, 4, 10]))
    torch.testing.assert_close(out[:, :4], csp(a, sa, 2), rtol=0, atol=0)
    torch.testing.assert_close(out[:, 4:], csp(b, sb, 2), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"per-sequence shifts.*\(1, 2, 5\)"):
        csp(torch.cat([a, b], 1), torch.zeros(1, 3, 5, dtype=torch.long), 2, cu_seqlens=torch.tensor([0, 4, 10]))
