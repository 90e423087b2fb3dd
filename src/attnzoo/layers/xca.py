"""Cross-covariance attention (XCiT, El-Nouby et al., 2021): attention over channels, linear in tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.layers.base import Attention, Masks, QKVProjection, register_attention
from attnzoo.ops._varlen import segments
from attnzoo.ops.xca import XCA, XCAOptions, xca, xca_weights
from attnzoo.ops.xca.parallel import xca_segment_weights

__all__ = ["XCAttention"]


@register_attention("xca")
class XCAttention(QKVProjection, Attention):
    """XCA (XCiT eq. 2): per head ``out = V softmax(q_hat^T k_hat * tau_h)^T`` with ``q_hat, k_hat`` L2-normalised
    along tokens and a learned per-head temperature ``tau`` (``temperature``, ``(heads, 1, 1)``, init 1).

    Bidirectional only (``causal=True`` raises): the ``(P, P)`` map sums over all tokens. Layout as XCiT's ``XCA``:
    ``qkv = Linear(dim, 3 dim, bias=True)``, ``temperature``, ``proj = Linear(dim, dim)``.

    Internals recorded under :func:`~attnzoo.layers.base.capture_internals`: ``attn`` ``(B, H, P, P)``, the
    channel-attention probabilities (before attention dropout), ``P = dim // heads``; with ``cu_seqlens``
    ``(1, H, S, P, P)``, one map per packed sequence.

    ``forward(x, attention_mask=..., cu_seqlens=...)``: the channel norms and covariance sum over each sequence's
    own real tokens (see :func:`~attnzoo.ops.xca.xca`); padding tokens give 0.
    """

    mechanism = XCA
    supports_masks = True

    def build(self, o: XCAOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.attn_dropout = o.attn_dropout
        self._init_projections(o)
        self.temperature = nn.Parameter(torch.ones(self.heads, 1, 1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks) -> torch.Tensor:
        """XCiT eq. 2 on the heads ``(B, H, N, P)``; the ``(P, P)`` maps while capturing."""
        p = self.attn_dropout if self.training else 0.0
        if self.capturing and not any(m is not None for m in masks.values()):
            attn = xca_weights(q, k, self.temperature)
            self.record(attn=attn)
            return torch.matmul(v.to(attn.dtype), F.dropout(attn, p=p, training=p > 0).transpose(-1, -2)).to(v.dtype)
        if self.capturing:
            b, _, n, _ = q.shape
            seg = segments(b, n, **masks, device=q.device)
            attn = xca_segment_weights(q, k, self.temperature, seg)
            self.record(attn=attn.squeeze(2) if masks["cu_seqlens"] is None else attn)
        return xca(q, k, v, self.temperature, dropout_p=p, **masks)
