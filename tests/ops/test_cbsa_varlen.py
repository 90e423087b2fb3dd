"""CBSA with padding masks and packed rows: every sequence as if alone, for every backend."""

from __future__ import annotations

import pytest
import torch
from conftest import mask_backends
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.layers.cbsa import CBSAAttention
from attnzoo.ops.cbsa import CBSA, cbsa, pool_reps, pool_reps_1d, pool_reps_2d, pool_reps_varlen


def _seqs(lengths, h=2, p=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(1, h, n, p, generator=g, dtype=dtype)} for n in lengths]


def _shared(variant, eta):
    return {"eta": eta} if variant in ("cbsa", "agent") else None  # only these extract (eq 5)


def _call(variant, contraction, backend, num_reps, prefix=0):
    def call(w, eta=1.0, attention_mask=None, cu_seqlens=None):
        reps, kw = None, {}
        if variant in ("cbsa", "agent"):
            if attention_mask is None and cu_seqlens is None:
                reps = pool_reps_1d(w, num_reps, num_prefix_tokens=prefix)
            else:
                reps, kw = pool_reps_varlen(
                    w, num_reps, num_prefix_tokens=prefix, attention_mask=attention_mask, cu_seqlens=cu_seqlens
                )
        kw.update(attention_mask=attention_mask, cu_seqlens=cu_seqlens)
        return cbsa(w, reps, variant=variant, contraction=contraction, eta=eta, eps=0.8, backend=backend, **kw)

    return call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant,contraction", [("cbsa", "softmax"), ("cbsa", "exact"), ("agent", None)])
def test_equal_to_alone_with_prefix_tokens(variant, contraction, mode):
    eta = torch.randn(2, 1, 1, dtype=torch.float64)
    call = _call(variant, contraction, "torch", num_reps=2, prefix=1)
    assert_equal_to_alone(call, _seqs([4, 2, 7]), {"w": 2}, mode=mode, shared=_shared(variant, eta))


@pytest.mark.parametrize("backend", mask_backends(CBSA))
def test_explicit_reps_split_evenly_in_a_packed_row(backend):
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64), torch.randn(1, 2, 5, 4, generator=g).double()
    r1, r2 = torch.randn(1, 2, 2, 4, generator=g, dtype=torch.float64), torch.randn(1, 2, 2, 4, generator=g).double()
    cu = torch.tensor([0, 3, 8])
    out = cbsa(torch.cat([w1, w2], 2), torch.cat([r1, r2], 2), cu_seqlens=cu, backend=backend, contraction="exact")
    torch.testing.assert_close(out[:, :, :3], cbsa(w1, r1, contraction="exact"), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out[:, :, 3:], cbsa(w2, r2, contraction="exact"), rtol=1e-10, atol=1e-12)


def test_mask_errors():
    w, reps = torch.randn(1, 1, 6, 2), torch.randn(1, 1, 3, 2)
    with pytest.raises(ValueError, match="M=3 representatives for 2 packed sequences"):
        cbsa(w, reps, cu_seqlens=torch.tensor([0, 2, 6]))
    with pytest.raises(ValueError, match="need attention_mask or cu_seqlens"):
        cbsa(w, reps, reps_attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="pair attention_mask with reps_attention_mask"):
        cbsa(w, reps, attention_mask=torch.ones(1, 6), reps_cu_seqlens=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="return_internals is not available"):
        cbsa(w, reps, attention_mask=torch.ones(1, 6), return_internals=True)
    with pytest.raises(ValueError, match="no non-prefix tokens"):
        pool_reps_varlen(w, 2, num_prefix_tokens=2, cu_seqlens=torch.tensor([0, 2, 6]))


_MASKS = [
    ("attention_mask", torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1, 0], [1] * 10], dtype=torch.bool)),
    ("cu_seqlens", torch.tensor([0, 4, 10], dtype=torch.int32)),
]


@pytest.mark.parametrize("name,mask", _MASKS)
def test_2d_pooling_refuses_masks_naming_what_works(name, mask):
    # a padded or packed row is no (Hg, Wg) image: 2-D pooling must not silently pool padding or mix sequences
    b = mask.shape[0] if name == "attention_mask" else 1
    layer = CBSAAttention(8, 2, grid=(3, 3), num_prefix_tokens=1)
    x = torch.randn(b, 10, 8)
    want = r"2-D pooling \(grid=\(3, 3\)\) does not take attention_mask / cu_seqlens \(got " + name + r"\).*1-D pooling"
    with pytest.raises(ValueError, match=want):
        layer(x, **{name: mask})
    w = torch.randn(b, 2, 10, 4)
    with pytest.raises(ValueError, match=want):
        pool_reps(w, grid=(3, 3), num_prefix_tokens=1, **{name: mask})
    with pytest.raises(ValueError, match=want):
        pool_reps_2d(w, (3, 3), num_prefix_tokens=1, **{name: mask})
    with pytest.raises(ValueError, match="pool_reps_varlen"):
        pool_reps(w, num_reps=2, **{name: mask})  # 1-D: the reps would not say which sequence they belong to
    assert layer(x).shape == x.shape  # without masks 2-D pooling runs
    torch.testing.assert_close(
        pool_reps(w, grid=(3, 3), num_prefix_tokens=1), pool_reps_2d(w, (3, 3), num_prefix_tokens=1)
    )
