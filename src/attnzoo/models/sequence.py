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

__all__ = ["SequenceClassifier"]


@register_architecture
class SequenceClassifier(PretrainedModel):
    """``(B, N)`` token ids -> ``(B, num_classes)`` logits, with any bidirectional mechanism.

    ``pool="cls"`` prepends a learned CLS token (mechanisms are told ``num_prefix_tokens=1``);
    ``"mean"`` averages the tokens. ``dual=True`` (LRA Retrieval): ``forward(a, b)`` encodes both
    sequences with the shared encoder and classifies ``[u, v, u*v, u-v]`` of their pooled features.
    The head is ``Linear`` or, with ``head_dim``, ``Linear -> ReLU -> Linear``. There is no padding
    mask (the mechanisms take none): pad tokens, as in LRA's fixed-length inputs, are ordinary tokens.
    """

    config_class = SequenceClassifierConfig

    def __init__(self, config: SequenceClassifierConfig) -> None:
        super().__init__()
        if not isinstance(config, SequenceClassifierConfig):
            raise TypeError(f"SequenceClassifier needs a SequenceClassifierConfig, got {type(config).__name__}")
        self.config = cfg = config
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

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Pooled features ``(B, dim)`` of one batch of sequences ``(B, N)``."""
        cfg = self.config
        check_token_ids("tokens", tokens, cfg.vocab_size, cfg.max_len)
        x = self.embed(tokens)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        n = x.shape[1]
        if self.pos_embed is not None:
            x = x + self.pos_embed[:, :n]
        elif cfg.pos_embed == "sinusoidal":
            x = x + sinusoidal_positions(n, cfg.dim, device=x.device, dtype=x.dtype)
        x = self.drop(x)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return x[:, 0] if cfg.pool == "cls" else x.mean(dim=1)

    def forward(self, tokens: torch.Tensor, tokens2: torch.Tensor | None = None) -> torch.Tensor:
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
            u, v = self.encode(tokens), self.encode(tokens2)
            return self.head(torch.cat([u, v, u * v, u - v], dim=-1))
        if tokens2 is not None:
            raise ValueError("this classifier takes one sequence; set dual=True for two-sequence (retrieval) tasks")
        return self.head(self.encode(tokens))
