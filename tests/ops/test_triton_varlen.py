"""Triton kernels of TSSA and Fastmax over padded batches and packed rows, run on CPU under
TRITON_INTERPRET=1 (see test_triton_kernels.py): each equals the naive reference on the same masked input and each
sequence alone, forward and backward, left-padded, right-padded, packed and with holes in a row.

Shapes are tiny (the interpreter runs every program in Python, and its segmented scans call their combine once per
token) but cross the kernels' token blocks: blocks of 8 (TSSA) and 16 (Fastmax) tokens, lengths 1, 3, 9 and 17,
several sequences inside one block of a packed row.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402, F401
from varlen_cases import MODES, combine  # noqa: E402

from attnzoo.ops._varlen import segments  # noqa: E402
from attnzoo.ops.fastmax import fastmax  # noqa: E402
from attnzoo.ops.tssa import tssa  # noqa: E402

pytestmark = pytest.mark.triton

INTERPRET = os.environ["TRITON_INTERPRET"].lower() in ("1", "true", "on", "yes")
DEV = "cpu" if INTERPRET else "cuda"
F64 = dict(rtol=1e-10, atol=1e-11)
F32 = dict(rtol=2e-4, atol=2e-5)
# 1 token, a length across a block boundary that starts inside a block (after another sequence), several
# sequences in one block when packed
TSSA_LENGTHS = [3, 9, 1]
TSSA_BLOCK_N = 8
FM_LENGTHS = [3, 17, 1]


def _on_dev(d):
    return {k: v.to(DEV) if torch.is_tensor(v) else v for k, v in d.items()}


def _grads_of(out, leaves, cot):
    return torch.autograd.grad((out * cot).sum(), leaves)


def _check_against_naive(fn, inputs: dict, kw: dict, tol: dict, seed: int = 0):
    """``fn(backend=...)`` on one masked input: Triton equals naive, forward and every input's gradient."""
    gen = torch.Generator().manual_seed(seed)
    res = {}
    for backend in ("naive", "triton"):
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
        out = fn(backend=backend, **leaves, **kw)
        cot = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
        gen.manual_seed(seed)
        res[backend] = (out.detach(), _grads_of(out, list(leaves.values()), cot))
    torch.testing.assert_close(res["triton"][0], res["naive"][0], **tol)
    for name, got, want in zip(inputs, res["triton"][1], res["naive"][1], strict=True):
        torch.testing.assert_close(got, want, **tol, msg=lambda m, n=name: f"d{n}: {m}")


def _holed_mask(b: int, n: int) -> torch.Tensor:
    # padding in the middle of a row, a fully padded row, and a row of one real token
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, 2:5] = False
    mask[0, -2:] = False
    mask[1] = False
    mask[2, :-1] = False
    return mask


# ---------------------------------------------------------------------------------------------------
# TSSA
# ---------------------------------------------------------------------------------------------------
def _tssa_seqs(lengths, dtype, h=2, p=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(1, h, n, p, generator=g, dtype=dtype)} for n in lengths]


def _tssa_shared(lengths, dtype, causal, h=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    shared = {"temp": 0.5 + 2 * torch.rand(h, generator=g, dtype=dtype)}
    if causal:
        shared["bias"] = 0.3 * torch.randn(h, max(lengths) + 2, 1, generator=g, dtype=dtype)
    return shared


def _tssa_small_blocks(*, backend, w, temp, bias=None, causal, **kw):
    # the reference through the op; the kernels with 8-token blocks (several blocks per sequence at these lengths)
    if backend == "naive":
        return tssa(w, temp, causal=causal, bias=bias, backend="naive", **kw)
    from attnzoo.ops.tssa.triton import tssa_triton

    seg = segments(w.shape[0], w.shape[2], device=w.device, **kw)
    return tssa_triton(w, temp, causal=causal, bias=bias, seg=seg, block_n=TSSA_BLOCK_N)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_tssa_matches_naive_float64(causal, mode):
    lengths = TSSA_LENGTHS
    seqs = _tssa_seqs(lengths, torch.float64)
    shared = _tssa_shared(lengths, torch.float64, causal)
    combined, kw = combine(seqs, {"w": 2}, mode, torch.Generator().manual_seed(2))

    def fn(**a):
        return _tssa_small_blocks(causal=causal, **a)

    _check_against_naive(fn, _on_dev({**combined, **shared}), _on_dev(kw), F64)


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_holes_and_empty_rows_float32_feature_blocks(causal):
    # P = 20 with block_p = 16: a full and a masked feature block; float32 as on a GPU
    from attnzoo.ops.tssa.triton import tssa_triton

    g = torch.Generator().manual_seed(3)
    b, h, n, p = 3, 2, 11, 20
    w = (100 * torch.randn(b, h, n, p, generator=g)).to(DEV).requires_grad_(True)
    w_ref = w.detach().clone().requires_grad_(True)
    temp = torch.tensor([0.7, 1.9], device=DEV)
    bias = (0.3 * torch.randn(h, n, 1, generator=g)).to(DEV) if causal else None
    mask = _holed_mask(b, n).to(DEV)
    seg = segments(b, n, attention_mask=mask, device=DEV)
    out = tssa_triton(w, temp, causal=causal, bias=bias, seg=seg, block_n=4, block_p=16)
    ref = tssa(w_ref, temp, causal=causal, bias=bias, attention_mask=mask, backend="naive")
    torch.testing.assert_close(out, ref, **F32)
    assert bool((out[~mask[:, None, :, None].expand_as(out)] == 0).all())
    cot = torch.randn(out.shape, generator=g).to(DEV)
    torch.testing.assert_close(_grads_of(out, [w], cot)[0], _grads_of(ref, [w_ref], cot)[0], rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Fastmax
# ---------------------------------------------------------------------------------------------------
def _fm_seqs(lengths, dtype, h=2, d=3, dv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "q": torch.randn(1, h, n, d, generator=g, dtype=dtype),
            "k": torch.randn(1, h, n, d, generator=g, dtype=dtype),
            "v": torch.randn(1, h, n, dv, generator=g, dtype=dtype),
        }
        for n in lengths
    ]


AXES = {"q": 2, "k": 2, "v": 2}


# p = 2 in every mode; p = 1 (the same kernels without the s2 state) packed and in a padded batch
FM_CASES = [(2, c, m) for c in (False, True) for m in MODES] + [
    (1, True, "packed"),
    (1, False, "packed"),
    (1, False, "left"),
]


@pytest.mark.parametrize("p,causal,mode", FM_CASES)
def test_fastmax_matches_naive_float64(p, causal, mode):
    combined, kw = combine(_fm_seqs(FM_LENGTHS, torch.float64), AXES, mode, torch.Generator().manual_seed(2))

    def fn(**a):
        return fastmax(p=p, causal=causal, chunk_size=16, scale=0.3, **a)

    _check_against_naive(fn, _on_dev(combined), _on_dev(kw), F64)


@pytest.mark.parametrize("causal", [False, True])
def test_fastmax_holes_and_empty_rows_float32(causal):
    g = torch.Generator().manual_seed(4)
    b, h, n = 3, 2, 18
    inputs = {x: torch.randn(b, h, n, 3 if x != "v" else 5, generator=g).to(DEV) for x in "qkv"}
    mask = _holed_mask(b, n).to(DEV)

    def fn(**a):
        return fastmax(p=2, causal=causal, chunk_size=16, **a)

    _check_against_naive(fn, inputs, {"attention_mask": mask}, F32)


def test_auto_leaves_the_masked_kernels_until_a_gpu_has_run_them(monkeypatch):
    # the masked kernels are tested here under the interpreter only: "auto" keeps masked calls on the PyTorch path
    # on a GPU (named, backend="triton" runs them), and still takes the kernels for unmasked calls
    import importlib

    from attnzoo.ops import _cpu_kernels, _triton_utils
    from attnzoo.ops._dispatch import resolve_backend

    fm = importlib.import_module("attnzoo.ops.fastmax")
    ts = importlib.import_module("attnzoo.ops.tssa")
    monkeypatch.setattr(_triton_utils, "_triton_device", lambda x: True)
    monkeypatch.setattr(_triton_utils, "_FAILED", {})
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    seg = segments(1, 4, attention_mask=torch.ones(1, 4))
    q = torch.randn(1, 1, 4, 64)
    for causal in (False, True):
        opts = dict(p=2, causal=causal, scale=None, chunk_size=None, segs=None)
        assert resolve_backend(fm.FASTMAX, "auto", q, inputs=(q, q, q), options=opts) == "triton", causal
        opts["segs"] = seg
        assert resolve_backend(fm.FASTMAX, "auto", q, inputs=(q, q, q), options=opts) == "torch", causal
    w = torch.randn(1, 2, 4, 3)
    for causal in (False, True):
        opts = dict(causal=causal, seg=None)
        assert resolve_backend(ts.TSSA, "auto", w, inputs=(w, torch.ones(2), None), options=opts) == "triton"
        opts["seg"] = seg
        assert resolve_backend(ts.TSSA, "auto", w, inputs=(w, torch.ones(2), None), options=opts) == "torch"
