"""Prefill: a prompt through a mechanism's parallel (causal) form once, handing its decoding state to ``step``.

Replaying a prompt token by token through ``step`` costs one sequential step per token; the parallel form computes
the same outputs at once, and the state after the prompt is a closed form of the prompt's projections:

- softmax, MSSA: the key/value cache is the prompt's projected ``k, v`` (``w``) ``(B, H, T, P)`` (Vaswani et al.
  2017, eq. 1; AoT eq. 3), padding slots included (their ``step`` skips them by its mask);
- Fastmax: the moment sums ``sum_t phi(k_hat_t) v_t^T`` and ``sum_t phi(k_hat_t)`` (FAST eqs. 34-35);
- TSSA: the running sums of Alg. 2 (ToST eq. 28);
- linear: ``S = sum_t phi(k_t) v_t^T`` ``(B, H, P, P)`` and ``z = sum_t phi(k_t)`` ``(B, H, P)`` (Katharopoulos
  et al. 2020, eqs. 18-20);

the sums over the real tokens only. Softmax, MSSA, Fastmax, TSSA and linear attention define ``prefill(x, *,
attention_mask=None) -> (out, state)`` on their layers, projecting the prompt once for both; :func:`prefill` calls
it and returns ``None`` for the others (their callers replay the prompt). CBSA has no causal form, hence no
decoding state to fill.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["prefill", "has_prefill"]


def prefill(
    mixer: nn.Module, x: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, Any] | None:
    """``(out (B, T, dim), state)``: the causal parallel forward of the prompt ``x (B, T, dim)`` and the decoding
    state after it (what ``step`` would hold after feeding ``x`` token by token); ``attention_mask (B, T)`` marks
    the real tokens. ``None`` when ``mixer`` has no prefill (replay the prompt through ``step`` instead)."""
    if not getattr(mixer, "causal", False):
        return None  # a bidirectional mixer has no decoding state
    own = getattr(mixer, "prefill", None)
    if not callable(own):
        return None
    return own(x) if attention_mask is None else own(x, attention_mask=attention_mask)


def has_prefill(mixer: nn.Module) -> bool:
    """Whether :func:`prefill` computes ``mixer``'s state from a parallel pass of a (padded) prompt."""
    return bool(getattr(mixer, "causal", False)) and callable(getattr(mixer, "prefill", None))
