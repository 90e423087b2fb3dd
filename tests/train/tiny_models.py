"""Tiny models for the trainer's tests (one per task kind), independent of attnzoo.models."""

from __future__ import annotations

import torch
from torch import nn


class TinyImageClassifier(nn.Module):
    def __init__(self, in_chans: int, img_size: int, num_classes: int, hidden: int = 32, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_chans * img_size * img_size, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):  # (B, C, H, W) -> (B, num_classes)
        return self.net(x)


class TinySeqClassifier(nn.Module):
    def __init__(self, vocab_size: int, num_classes: int, dim: int = 16, pair: bool = False):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim * (2 if pair else 1), num_classes)

    def forward(self, ids, ids_b=None, *, attention_mask=None, attention_mask2=None):
        # (B, N)[, (B, N)] -> (B, num_classes); the masks (B, N) (True = real token) restrict the mean pool
        h = self._pool(ids, attention_mask)
        if ids_b is not None:
            h = torch.cat([h, self._pool(ids_b, attention_mask2)], -1)
        return self.head(h)

    def _pool(self, ids, mask):
        if mask is None:
            return self.emb(ids).mean(1)
        m = mask[..., None].to(self.emb.weight.dtype)
        return (self.emb(ids) * m).sum(1) / m.sum(1).clamp_min(1)


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.emb.weight  # tied, like the real decoders

    def forward(self, ids, *, cu_seqlens=None):  # (B, N) -> (B, N, V): a bigram model
        # no token sees another, so a packed row (cu_seqlens) needs nothing more
        return self.head(self.emb(ids))


class TinyICL(nn.Module):
    """One step of in-context gradient descent: ``y_i = a * x_i . mean_{j<i}(y_j x_j) + b``."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.1))
        self.b = nn.Parameter(torch.tensor(0.0))

    def forward(self, xs, ys):  # (B, n, d), (B, n) -> (B, n)
        yx = ys[..., None] * xs
        prev = torch.cumsum(yx, 1) - yx
        count = torch.arange(xs.shape[1], device=xs.device).clamp(min=1)[None, :, None]
        return self.a * (xs * prev / count).sum(-1) + self.b


def tiny_factory(cfg, task):
    """``model_factory`` for ``attnzoo.train.trainer.train``."""
    i = task.info
    if task.kind == "image_classification":
        return TinyImageClassifier(
            i["in_chans"], i["img_size"], i["num_classes"], dropout=float(cfg.model_options.get("dropout", 0.0))
        )
    if task.kind == "sequence_classification":
        return TinySeqClassifier(i["vocab_size"], i["num_classes"])
    if task.kind == "pair_classification":
        return TinySeqClassifier(i["vocab_size"], i["num_classes"], pair=True)
    if task.kind == "causal_lm":
        return TinyLM(i["vocab_size"])
    return TinyICL()
