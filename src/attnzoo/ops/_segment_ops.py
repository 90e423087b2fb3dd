"""Vectorised building blocks for ops that honour :class:`~attnzoo.ops._varlen.Segments`.

The naive references run each sequence alone (:func:`run_each_alone`, :func:`each_sequence_alone`); the fast paths
use the helpers below: the boolean key mask of the quadratic mechanisms (:func:`attention_allowed`), one-hot
segment sums (:func:`segment_onehot`), reading a per-segment matrix at each token (:func:`apply_per_segment`) and
zeroing the padding outputs (:func:`zero_padding`). None loops over sequences.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from attnzoo.ops._varlen import Segments, segments

__all__ = [
    "run_each_alone",
    "each_sequence_alone",
    "attention_allowed",
    "segment_onehot",
    "apply_per_segment",
    "zero_padding",
    "zero_padding_tokens",
    "real_4d",
]


def real_4d(seg: Segments) -> torch.Tensor:
    """``(B, 1, N, 1)`` bool: True at real tokens (broadcasts over heads and channels of ``(B, H, N, P)``)."""
    return seg.real[:, None, :, None]


def zero_padding(out: torch.Tensor, seg: Segments) -> torch.Tensor:
    """``out (B, H, N, P)`` with padding positions set to exactly 0 (``where``: no NaN/inf leaks, zero gradient)."""
    return torch.where(real_4d(seg), out, torch.zeros((), dtype=out.dtype, device=out.device))


def zero_padding_tokens(y: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """A layer's output ``y (B, N, dim)`` with the padding tokens of ``attention_mask`` ``(B, N)`` (already checked
    by the op) set to 0: the output projection's bias must not reappear there. A packed row has no padding."""
    if attention_mask is None:
        return y
    return torch.where(attention_mask[..., None] != 0, y, torch.zeros((), dtype=y.dtype, device=y.device))


def run_each_alone(
    fn: Callable[..., torch.Tensor], seg: Segments, tensors: Sequence[torch.Tensor], out_dim: int
) -> torch.Tensor:
    """The definition: ``fn(*tensors)`` on each sequence's real tokens alone, scattered back; zeros elsewhere.

    ``tensors`` ``(B, H, N, *)`` share the token axis 2; ``fn`` maps ``(1, H, n, *)`` inputs to ``(1, H, n,
    out_dim)``. A Python loop over sequences: for references only.
    """
    x = tensors[0]
    out = x.new_zeros(x.shape[0], x.shape[1], x.shape[2], out_dim)
    for b, idx in seg.sequences():
        idx = idx.to(x.device)
        res = fn(*(t[b : b + 1].index_select(2, idx) for t in tensors))
        out[b, :, idx] = res[0].to(out.dtype)
    return out


def each_sequence_alone(tokens: int) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """Decorator of a naive reference ``fn(*tensors, *rest, **options)`` whose first ``tokens`` tensors ``(B, H, N, *)``
    share the token axis 2: it takes ``attention_mask`` / ``cu_seqlens`` too, and with them runs ``fn`` on each
    sequence's real tokens alone (:func:`run_each_alone`: the definition of the masked op), the output as wide as
    the last of those tensors; padding rows are 0."""

    def decorate(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(fn)
        def alone(
            *args: object,
            attention_mask: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None,
            **options: object,
        ) -> torch.Tensor:
            b, _, n, _ = args[0].shape
            seg = segments(b, n, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=args[0].device)
            if seg is None:
                return fn(*args, **options)
            rest = args[tokens:]
            return run_each_alone(lambda *t: fn(*t, *rest, **options), seg, args[:tokens], args[tokens - 1].shape[-1])

        sig = inspect.signature(fn)
        masks = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation="torch.Tensor | None")
            for n in ("attention_mask", "cu_seqlens")
        ]
        alone.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *masks])
        return alone

    return decorate


def attention_allowed(seg: Segments, causal: bool, *, pad_self: bool = True) -> torch.Tensor:
    """``(B, 1, N, N)`` bool, True where query ``i`` may attend to key ``j``: same sequence, ``j`` real, and
    ``pos_j <= pos_i`` when causal (``(B, 1, 1, N)`` for a bidirectional padded batch). With ``pad_self`` no row is
    empty (an all-masked row gives NaN in softmax, and NaN would reach the gradients): each padding query attends
    to itself only (or to the real keys) -- its output is zeroed afterwards."""
    ids = seg.ids
    if pad_self and not causal and seg.num == 1:
        # a padded batch: a (B, 1, 1, N) key mask suffices (fused SDPA kernels take it without an N x N tensor);
        # padding queries read the real keys (zeroed afterwards), and a row without real tokens reads every key
        return (seg.real | ~seg.real.any(dim=1, keepdim=True))[:, None, None, :]
    allowed = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0)
    if causal:
        n = ids.shape[1]
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
    if not pad_self:
        return allowed[:, None]
    eye = torch.eye(ids.shape[1], dtype=torch.bool, device=ids.device)
    return (allowed | (eye & ~seg.real[:, :, None]))[:, None]


def segment_onehot(seg: Segments, dtype: torch.dtype) -> torch.Tensor:
    """``(B, N, S)`` with ``1`` where token ``n`` is a real token of sequence ``s``: ``sum_n onehot[n, s] x_n``
    sums a sequence's real tokens."""
    onehot = F.one_hot(seg.ids.clamp_min(0), seg.num).to(dtype)
    return onehot * seg.real[..., None].to(dtype)


def apply_per_segment(x: torch.Tensor, mats: torch.Tensor, seg: Segments) -> torch.Tensor:
    """``y_n = x_n @ M_{s(n)}``: ``x (B, H, N, P)``, ``mats (B, H, S, P, R)`` -> ``(B, H, N, R)`` (padding reads
    sequence 0; zero it afterwards)."""
    if mats.shape[2] == 1:
        return torch.matmul(x, mats[:, :, 0])
    b, h, s, p, r = mats.shape
    n = x.shape[2]
    if s <= p:
        # every token against every sequence's matrix, then keep its own: O(N S P R) time, O(N S R) memory
        y = torch.matmul(x, mats.permute(0, 1, 3, 2, 4).reshape(b, h, p, s * r)).view(b, h, n, s, r)
        idx = seg.ids.clamp_min(0)[:, None, :, None, None].expand(b, h, n, 1, r)
        return y.gather(3, idx).squeeze(3)
    # many short sequences: gather each token's matrix (O(N P R) memory)
    idx = seg.ids.clamp_min(0)[:, None, :, None, None].expand(b, h, n, p, r)
    per_tok = mats.gather(2, idx)
    return torch.matmul(x.unsqueeze(-2), per_tok).squeeze(-2)
