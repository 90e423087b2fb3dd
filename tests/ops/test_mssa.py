"""mssa: SDPA fast path (q = k = v = w) vs the explicit reference, AoT's causal / normalised-query forms."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_half_close

from attnzoo.ops.mssa import mssa, mssa_weights
from attnzoo.ops.softmax import softmax_attention


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("causal,normalize_query", [(False, False), (True, True)])
def test_gradcheck(backend, causal, normalize_query):
    w = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a: mssa(a, causal=causal, normalize_query=normalize_query, scale=0.8, backend=backend), (w,)
    )


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_matches_aot_definition(backend):
    # AoT eq. 3 per head (columns = tokens): (U^T Z) softmax_col((U^T Z)^T (U^T Z) * scale); here rows = tokens.
    w = torch.randn(2, 2, 6, 4, dtype=torch.float64)
    scale = 0.4
    cols = w.transpose(-1, -2)  # (B, H, P, N)
    gram = cols.transpose(-1, -2) @ cols * scale  # [i, j] = <w_i, w_j>
    expected = (cols @ torch.softmax(gram, dim=-2)).transpose(-1, -2)  # column j softmax over i
    torch.testing.assert_close(mssa(w, scale=scale, backend=backend), expected)
    # §4.1: Mask(Z^T U P(U^T Z)): query columns j normalised, keys i <= j kept
    qn = F.normalize(cols, dim=-2)
    logits = (cols.transpose(-1, -2) @ qn) * scale  # [i, j] = <w_i, w_j / |w_j|>
    logits = logits.masked_fill(torch.arange(6)[:, None] > torch.arange(6)[None, :], -torch.inf)
    expected = (cols @ torch.softmax(logits, dim=-2)).transpose(-1, -2)
    torch.testing.assert_close(mssa(w, causal=True, normalize_query=True, scale=scale, backend=backend), expected)


def test_equals_softmax_attention_with_shared_qkv_and_default_scale():
    w = torch.randn(2, 3, 9, 4, dtype=torch.float64)
    torch.testing.assert_close(mssa(w, causal=True), softmax_attention(w, w, w, causal=True, scale=0.5))


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("normalize_query", [False, True])
def test_noncausal_permutation_equivariance(backend, normalize_query):
    w = torch.randn(2, 3, 11, 4, dtype=torch.float64)
    perm = torch.randperm(11)
    out = mssa(w, normalize_query=normalize_query, backend=backend)
    torch.testing.assert_close(mssa(w[:, :, perm], normalize_query=normalize_query, backend=backend), out[:, :, perm])


def test_weights_are_softmax_of_shared_gram():
    w = torch.randn(1, 2, 7, 4, dtype=torch.float64)
    a = mssa_weights(w, causal=False, scale=0.5, normalize_query=False)
    torch.testing.assert_close(a.sum(-1), torch.ones(1, 2, 7, dtype=torch.float64))
    # log-weights equal the symmetric Gram logits <w_i, w_j> * scale up to a per-row constant
    la, logits = a.log(), (w @ w.transpose(-1, -2)) * 0.5
    torch.testing.assert_close(la - la[..., :1], logits - logits[..., :1])
    assert torch.all(mssa_weights(w, causal=True, scale=0.5, normalize_query=True).triu(1) == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_float32(dtype):
    w = torch.randn(2, 2, 12, 8)
    ref = mssa(w, causal=True, normalize_query=True, backend="naive")
    for backend in ("naive", "torch"):
        out = mssa(w.to(dtype), causal=True, normalize_query=True, backend=backend)
        assert out.dtype == dtype
        assert_half_close(out, ref)


def test_errors():
    w = torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match=r"w must have shape \(B, H, N, P\)"):
        mssa(w[0])
    bad = w.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="w contains non-finite values"):
        mssa(bad)
    with pytest.raises(ValueError, match="scale must be None or a positive finite number, got inf"):
        mssa(w, scale=float("inf"))
    with pytest.raises(TypeError, match="normalize_query must be a bool"):
        mssa(w, normalize_query="yes")
    with pytest.raises(ValueError, match=r"backend='flash' is not supported by mssa; valid backends"):
        mssa(w, backend="flash")
    with pytest.raises(TypeError, match="floating-point"):
        mssa(torch.ones(1, 2, 4, 3, dtype=torch.int32))
