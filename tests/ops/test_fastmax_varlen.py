"""Fastmax with padding masks and packed rows: every backend equals each sequence run alone."""

import importlib

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo._checks import NonFiniteError
from attnzoo.layers.fastmax import FastmaxAttention
from attnzoo.ops.fastmax import MASK_BACKENDS, fastmax, fastmax_dropout

AXES = {"q": 2, "k": 2, "v": 2}
# lengths 1, and not multiples of the chunk (4 here, the default 64 in the float32 case)
LENGTHS = [5, 1, 9, 4]


def _seqs(lengths, dtype=torch.float64, d=3, dv=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        {n: torch.randn(1, 2, length, d if n != "v" else dv, generator=gen, dtype=dtype) for n in "qkv"}
        for length in lengths
    ]


def _call(backend, p, causal, chunk=4):
    scale = 0.25 if p == 1 else None  # p=1 weights are an average for scale <= 1/D

    def call(q, k, v, **kw):
        return fastmax(q, k, v, p=p, causal=causal, scale=scale, backend=backend, chunk_size=chunk, **kw)

    return call


def test_unmasked_paths_unchanged_by_an_all_real_mask():
    q, k, v = (torch.cat([s[n] for s in _seqs([7, 7])]) for n in "qkv")
    for causal in (False, True):
        ref = fastmax(q, k, v, causal=causal, backend="torch", chunk_size=4)
        got = fastmax(q, k, v, causal=causal, backend="torch", chunk_size=4, attention_mask=torch.ones(2, 7))
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_row_without_real_tokens_gives_zeros():
    q, k, v = (torch.randn(2, 1, 5, 3, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[0, 0, 0, 0, 0], [0, 1, 1, 0, 1]])
    for backend in MASK_BACKENDS:
        out = fastmax(q, k, v, backend=backend, attention_mask=mask)
        assert bool((out[0] == 0).all()) and bool((out[1, :, [0, 3]] == 0).all()) and bool(out.isfinite().all())


def test_bad_input_errors():
    q = torch.randn(2, 1, 5, 3)
    with pytest.raises(ValueError, match="shape"):
        fastmax(q, q, q, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="batch size 1"):
        fastmax(q, q, q, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="not both"):
        fastmax(q[:1], q[:1], q[:1], attention_mask=torch.ones(1, 5), cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="attention_mask/cu_seqlens"):
        fastmax_dropout(q, q, q, rate=0.1, placement="1d", attention_mask=torch.ones(2, 5))


def _p1_cpu(q, k, v, **kw):
    """p=1 on the "cpu" backend at D = 17 with scale 1/D (non-negative weights): the fused kernel's cases."""
    return fastmax(q, k, v, p=1, scale=1 / 17, backend="cpu", **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_kernel_takes_segments_natively(monkeypatch, dtype, mode):
    # p=1 non-causal inference runs the fused kernel with the per-token sequence ids (counted calls), with lengths
    # around its 64-token block and its 8-row register block, and widths that are not whole vectors
    fm = importlib.import_module("attnzoo.ops.fastmax")
    calls = []
    kernel = fm.fastmax_cpu.fastmax_p1_segments_cpu
    monkeypatch.setattr(fm.fastmax_cpu, "fastmax_p1_segments_cpu", lambda *a: calls.append(1) or kernel(*a))
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    for lengths in ([5, 1, 9, 4], [70, 1, 130, 64]):
        seqs = _seqs(lengths, dtype=dtype, d=17, dv=9)
        with torch.no_grad():
            assert_equal_to_alone(_p1_cpu, seqs, AXES, mode=mode, backward=False, rtol=tol, atol=tol)
    assert len(calls) == 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_kernel_trains_on_segments_natively(monkeypatch, dtype, mode):
    # p=1 non-causal training over padded batches / packed rows runs the fused kernel and its C++ backward on the
    # whole batch with the sequence ids (one counted call, no slices), forward and backward equal to each alone
    fm = importlib.import_module("attnzoo.ops.fastmax")
    calls = []
    kernel = fm.fastmax_cpu.fastmax_p1_segments_cpu
    monkeypatch.setattr(fm.fastmax_cpu, "fastmax_p1_segments_cpu", lambda *a: calls.append(1) or kernel(*a))
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    seqs = _seqs([70, 1, 130, 64], dtype=dtype, d=17, dv=9)
    assert_equal_to_alone(_p1_cpu, seqs, AXES, mode=mode, rtol=tol, atol=tol)
    assert len(calls) == 1


def test_cpu_kernel_backward_over_a_mask_with_holes_matches_the_reference_and_gradcheck():
    # a row whose real tokens are not contiguous is one sequence with gaps: the kernel's forward and backward equal
    # the reference's, the gaps get zero gradient, and gradcheck passes through the C++ backward
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 11, 5, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[0, [0, 4, 5, 10]] = False
    mask[1, 6:] = False

    def call(backend):
        return lambda q, k, v: fastmax(q, k, v, p=1, scale=0.2, backend=backend, attention_mask=mask)

    g = torch.randn(2, 2, 11, 5, generator=gen, dtype=torch.float64)
    got, want = (torch.autograd.grad(call(b)(q, k, v), (q, k, v), g) for b in ("cpu", "naive"))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        assert a[~mask[:, None, :, None].expand_as(a)].abs().max() == 0
    assert torch.autograd.gradcheck(call("cpu"), (q, k, v))


def test_cpu_kernel_training_over_segments_reports_non_finite_real_tokens():
    # the checks read what the kernel reports: NaN in a real token raises, naming the input
    q, k, v = (torch.randn(2, 2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        k[1, 0, 4, 2] = float("nan")
    with pytest.raises(NonFiniteError, match="k"):
        fastmax(q, k, v, p=1, scale=0.25, backend="cpu", attention_mask=mask)


@pytest.mark.parametrize("p", [1, 2])
def test_decoding_a_left_padded_prompt_equals_decoding_it_alone(p):
    torch.manual_seed(0)
    layer = FastmaxAttention(12, 3, causal=True, p=p, scale=0.25 if p == 1 else None).to(torch.float64)
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    pad = 1e3 * torch.randn(1, 3, 12, dtype=torch.float64)
    padded = torch.cat([pad, x], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    state, alone = layer.init_state(1, dtype=torch.float64), layer.init_state(1, dtype=torch.float64)
    outs = []
    for t in range(8):
        y, state = layer.step(padded[:, t : t + 1], state, attention_mask=mask[:, t : t + 1])
        outs.append(y)
    want = []
    for t in range(5):
        y, alone = layer.step(x[:, t : t + 1], alone)
        want.append(y)
    got = torch.cat(outs, dim=1)
    assert bool((got[:, :3] == 0).all())
    torch.testing.assert_close(got[:, 3:], torch.cat(want, dim=1), rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(state.num, alone.num, rtol=1e-10, atol=1e-11)
    # and it equals the masked parallel forward
    torch.testing.assert_close(got, layer(padded, attention_mask=mask), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("mode", ["left", "right"])
@pytest.mark.parametrize("backend", ["torch", "torch_autograd"])
def test_padded_non_causal_total_moments_over_several_spans(monkeypatch, backend, mode):
    # a padded non-causal batch reads each row's total moments, summed in spans of _TOTAL_FEATURES feature
    # elements: shrunk here so that the sums run over several spans, the last one partial
    monkeypatch.setattr(importlib.import_module("attnzoo.ops.fastmax.varlen"), "_TOTAL_FEATURES", 60)
    assert_equal_to_alone(_call(backend, 2, False), _seqs(LENGTHS), AXES, mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
def test_cpu_feature_kernel_takes_segments_natively(monkeypatch, p, causal, mode):
    # every case but the fused kernel's (p=1 non-causal) runs the feature-map kernel over the whole batch with the
    # per-token sequence ids: one counted call per forward, never the PyTorch sweeps; lengths around its 4-token
    # groups, float64, forward and backward
    fm = importlib.import_module("attnzoo.ops.fastmax")
    calls = []
    kernel = fm.feature_attention_cpu
    monkeypatch.setattr(fm, "feature_attention_cpu", lambda *a, **k: calls.append(k["ids"]) or kernel(*a, **k))
    monkeypatch.setattr(fm, "masked_sweeps", None)  # a call would fail
    assert_equal_to_alone(_call("cpu", p, causal), _seqs(LENGTHS), AXES, mode=mode)
    masked = [ids for ids in calls if ids is not None]  # the other calls are each sequence alone, unmasked
    fused = p == 1 and not causal
    assert len(masked) == (0 if fused else 1) and len(calls) == (0 if fused else 1 + len(LENGTHS))
    assert all(ids.shape[-1] == (sum(LENGTHS) if mode == "packed" else 9) for ids in masked)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
def test_auto_on_cpu_runs_a_kernel_for_every_masked_call(monkeypatch, causal, mode):
    # "auto" never takes the PyTorch sweeps for a masked float CPU call
    fm = importlib.import_module("attnzoo.ops.fastmax")
    monkeypatch.setattr(fm, "masked_sweeps", None)
    for p in (1, 2):
        assert_equal_to_alone(_call("auto", p, causal), _seqs(LENGTHS), AXES, mode=mode)
