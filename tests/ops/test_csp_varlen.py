"""CSP with padding masks and packed rows (issue 27): shifts and group sorts within each sequence, as if alone."""

from __future__ import annotations

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.layers.csp import CSPAttention
from attnzoo.ops.csp import csp

SHIFTS = torch.tensor([0, 3, 11, 1, 7])  # larger than some lengths: each taken modulo the sequence's own length


def _seqs(lengths, c=5, dtype=torch.float64, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        v = torch.randn(1, n, c, generator=g, dtype=dtype)
        out.append({"v": v.round() if ties else v})  # rounded values tie often: the tie rule must match
    return out


def _call(groups, backend, shifts=SHIFTS):
    def call(v, attention_mask=None, cu_seqlens=None):
        return csp(v, shifts, groups, backend=backend, attention_mask=attention_mask, cu_seqlens=cu_seqlens)

    return call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["naive", "torch", "auto"])
@pytest.mark.parametrize(
    "groups,lengths",
    [(1, [5, 1, 7, 3]), (None, [5, 1, 7, 3]), (2, [6, 2, 8, 4]), (3, [9, 3, 6]), (4, [16, 4, 12]), (2, [2, 10])],
)
@pytest.mark.parametrize("ties", [False, True])
def test_equal_to_alone_float64(groups, lengths, backend, mode, ties):
    assert_equal_to_alone(_call(groups, backend), _seqs(lengths, ties=ties), {"v": 1}, mode=mode, out_axis=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("groups,lengths", [(1, [5, 1, 7]), (2, [6, 2, 8])])
def test_equal_to_alone_float32(groups, lengths, mode):
    seqs = _seqs(lengths, dtype=torch.float32)
    assert_equal_to_alone(_call(groups, "torch"), seqs, {"v": 1}, mode=mode, out_axis=1, rtol=1e-5, atol=1e-6)


def test_lengths_not_divisible_by_groups_are_an_error_as_alone():
    v = torch.randn(1, 7, 5)
    with pytest.raises(ValueError, match="groups"):
        csp(v[:, :3], SHIFTS, 2)  # alone
    with pytest.raises(ValueError, match=r"split into groups=2 equal groups.*\[3\]"):
        csp(v, SHIFTS, 2, cu_seqlens=torch.tensor([0, 4, 7]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("groups,lengths", [(3, [6, 6, 6]), (1, [2, 2]), (2, [4])])
def test_cpu_kernel_pairs_equal_to_alone(groups, lengths, ties, dtype, mode):
    # every sequence in groups of two: the fused kernel reads the sequences' runs in place
    seqs = _seqs(lengths, dtype=dtype, ties=ties)
    tol = dict(rtol=0, atol=0)  # values are only moved
    assert_equal_to_alone(_call(groups, "cpu"), seqs, {"v": 1}, mode=mode, out_axis=1, **tol)


def test_cpu_kernel_runs_for_pairs_and_the_torch_path_serves_the_rest():
    v = torch.randn(1, 10, 5, dtype=torch.float64)
    v.requires_grad_(True)
    assert (
        "PairsVarlen"
        in type(csp(v[:, :8], SHIFTS, 2, backend="cpu", cu_seqlens=torch.tensor([0, 4, 8])).grad_fn).__name__
    )
    mixed = csp(v, SHIFTS, 2, backend="cpu", cu_seqlens=torch.tensor([0, 4, 10]))  # groups of 2 and of 3
    assert "PairsVarlen" not in type(mixed.grad_fn).__name__
    torch.testing.assert_close(mixed, csp(v, SHIFTS, 2, backend="naive", cu_seqlens=torch.tensor([0, 4, 10])))
    holed = torch.tensor([[1, 0, 1, 1, 1, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(
        csp(v, SHIFTS, 2, backend="cpu", attention_mask=holed),
        csp(v, SHIFTS, 2, backend="naive", attention_mask=holed),
    )


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("groups", [1, 2, None])
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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("schedule", ["linear", "power"])
def test_layer_equal_to_alone(schedule, mode):
    torch.manual_seed(0)
    layer = CSPAttention(6, 2, groups=2, shift_schedule=schedule, num_layers=2, layer_index=1).double()
    g = torch.Generator().manual_seed(2)
    seqs = [{"x": torch.randn(1, n, 6, generator=g, dtype=torch.float64)} for n in (6, 2, 10)]
    assert_equal_to_alone(layer, seqs, {"x": 1}, mode=mode, out_axis=1)
    assert CSPAttention.supports_masks
