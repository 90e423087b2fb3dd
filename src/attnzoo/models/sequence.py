"""Sequence classifier for long-range tasks (LRA): embedding -> bidirectional blocks -> pooling -> head."""

from __future__ import annotations

import torch
from torch import nn

from attnzoo.layers._norms import build_norm
from attnzoo.models._registry import register_architecture
from attnzoo.models.blocks import build_blocks, init_weights, set_norm_eps
from attnzoo.models.checkpoint import PretrainedModel
from attnzoo.models.config import SequenceClassifierConfig
from attnzoo.models.embeddings import sinusoidal_positions
from attnzoo.models.language import check_token_ids
from attnzoo.ops._varlen import segments

__all__ = ["SequenceClassifier"]


@register_architecture
class SequenceClassifier(PretrainedModel):
    """``(B, N)`` token ids -> ``(B, num_classes)`` logits, with any bidirectional mechanism.

    ``pool="cls"`` prepends a learned CLS token (mechanisms are told ``num_prefix_tokens=1``);
    ``"mean"`` averages the tokens. ``dual=True`` (LRA Retrieval): ``forward(a, b)`` encodes both
    sequences with the shared encoder and classifies ``[u, v, u*v, u-v]`` of their pooled features.
    The head is ``Linear`` or, with ``head_dim``, ``Linear -> ReLU -> Linear``. ``attention_mask`` (LRA's padding)
    or ``cu_seqlens`` (packed rows) make each sequence computed and pooled as if alone (:meth:`encode`); without
    them every token, padding included, is content.
    """

    config_class = SequenceClassifierConfig

    def __init__(self, config: SequenceClassifierConfig) -> None:
        super().__init__(config)
        cfg = config
        self.num_prefix_tokens = 1 if cfg.pool == "cls" else 0
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if cfg.pool == "cls" else None
        self.pos_embed = (
            nn.Parameter(torch.zeros(1, cfg.max_len + self.num_prefix_tokens, cfg.dim))
            if cfg.pos_embed == "learned"
            else None
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = build_blocks(
            cfg,
            causal=False,
            context={"num_prefix_tokens": self.num_prefix_tokens, "max_len": cfg.max_len + self.num_prefix_tokens},
        )
        self.norm = build_norm(cfg.norm_layer, cfg.dim) if cfg.final_norm else nn.Identity()
        feat = 4 * cfg.dim if cfg.dual else cfg.dim
        if cfg.head_dim is None:
            self.head = nn.Linear(feat, cfg.num_classes)
        else:
            self.head = nn.Sequential(
                nn.Linear(feat, cfg.head_dim), nn.ReLU(), nn.Linear(cfg.head_dim, cfg.num_classes)
            )
        init_weights(self)
        set_norm_eps(self, cfg.norm_eps)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def encode(
        self,
        tokens: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled features ``(B, dim)`` of one batch of sequences ``(B, N)``.

        ``attention_mask (B, N)`` (1 = real token; LRA's padding): the mixers, the positions and the mean pooling
        see real tokens only, so each row gets what it gets alone. ``cu_seqlens (S + 1,)``: ``S`` sequences packed
        in one row ``(1, T)``, pooled to ``(S, dim)`` (mean pooling only: a CLS token leads one sequence per row).
        """
        cfg = self.config
        check_token_ids("tokens", tokens, cfg.vocab_size, cfg.max_len)
        seg = segments(*tokens.shape, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=tokens.device)
        if cu_seqlens is not None and cfg.pool == "cls":
            raise ValueError(
                "pool='cls' prepends one CLS token to each row, but a packed row (cu_seqlens) holds several "
                "sequences: pass a padded batch with attention_mask, or use pool='mean'"
            )
        x = self.embed(tokens)
        mask = None if attention_mask is None else seg.real
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            if mask is not None:  # the CLS token is real and first: positions 0 (CLS), 1.. (the real tokens)
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        x = self.drop(x + self._positions(x, mask, cu_seqlens))
        for blk in self.blocks:
            x = blk(x, attention_mask=mask, cu_seqlens=cu_seqlens)
        x = self.norm(x)
        if cfg.pool == "cls":
            return x[:, 0]
        if seg is None:
            return x.mean(dim=1)
        if cu_seqlens is not None:  # per-sequence sums: one index_add over the packed row
            sums = x.new_zeros(seg.num, x.shape[-1]).index_add_(0, seg.ids[0], x[0])
            return sums / seg.lengths[0, :, None].to(x.dtype)
        real = seg.real[..., None].to(x.dtype)
        return (x * real).sum(dim=1) / real.sum(dim=1).clamp_min(1)

    def _positions(self, x: torch.Tensor, mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None):
        """Position embeddings ``(1 or B, N, dim)`` of the tokens ``x (B, N, dim)``, read at each sequence's own
        positions (``Segments.pos``) when ``mask`` / ``cu_seqlens`` is given; ``0`` without positions."""
        cfg = self.config
        n = x.shape[1]
        seg = segments(x.shape[0], n, attention_mask=mask, cu_seqlens=cu_seqlens, device=x.device)
        if self.pos_embed is not None:
            return self.pos_embed[:, :n] if seg is None else self.pos_embed[0, seg.pos]
        if cfg.pos_embed == "sinusoidal":
            table = sinusoidal_positions(n, cfg.dim, device=x.device, dtype=x.dtype)
            return table if seg is None else table[seg.pos]
        return x.new_zeros(())

    def forward(
        self,
        tokens: torch.Tensor,
        tokens2: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        attention_mask2: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        cu_seqlens2: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, num_classes)``; the masks / offsets of ``tokens2`` are ``attention_mask2`` /
        ``cu_seqlens2`` (see :meth:`encode`)."""
        if self.config.dual:
            if tokens2 is None:
                raise ValueError("this is a two-sequence (dual) classifier: call model(tokens_a, tokens_b)")
            same_batch = (
                isinstance(tokens, torch.Tensor)
                and isinstance(tokens2, torch.Tensor)
                and (tokens.ndim == tokens2.ndim == 2 and tokens.shape[0] == tokens2.shape[0])
            )
            if not same_batch:
                raise ValueError("tokens and tokens2 must be (B, N) tensors with the same batch size B")
            u = self.encode(tokens, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
            v = self.encode(tokens2, attention_mask=attention_mask2, cu_seqlens=cu_seqlens2)
            if u.shape != v.shape:
                raise ValueError(f"the two inputs hold {u.shape[0]} and {v.shape[0]} sequences; they must pair up")
            return self.head(torch.cat([u, v, u * v, u - v], dim=-1))
        if tokens2 is not None or attention_mask2 is not None or cu_seqlens2 is not None:
            raise ValueError("this classifier takes one sequence; set dual=True for two-sequence (retrieval) tasks")
        return self.head(self.encode(tokens, attention_mask=attention_mask, cu_seqlens=cu_seqlens))
