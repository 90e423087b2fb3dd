"""Prefill: a prompt through a mechanism's parallel (causal) form once, handing its decoding state to ``step``.

Replaying a prompt token by token through ``step`` costs one sequential step per token; the parallel form computes
the same outputs at once, and the state after the prompt is a closed form of the prompt's projections:

- softmax, MSSA: the key/value cache is the prompt's projected ``k, v`` (``w``) ``(B, H, T, P)`` (Vaswani et al.
  2017, eq. 1; AoT eq. 3), padding slots included (their ``step`` skips them by its mask);
- Fastmax: the moment sums ``sum_t phi(k_hat_t) v_t^T`` and ``sum_t phi(k_hat_t)`` (FAST eqs. 34-35);
- TSSA: the running sums of Alg. 2 (ToST eq. 28);
- linear: ``S = sum_t phi(k_t) v_t^T`` ``(B, H, P, P)`` and ``z = sum_t phi(k_t)`` ``(B, H, P)`` (Katharopoulos
  et al. 2020, eqs. 18-20);

the sums over the real tokens only. Softmax, MSSA, Fastmax and TSSA define ``prefill(x, *, attention_mask=None) ->
(out, state)`` on their layers; :func:`prefill` calls it, or uses the adapter here (linear), and returns ``None``
for the others (their callers replay the prompt). CBSA has no causal form, hence no decoding state to fill.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from attnzoo.layers.linear import LinearAttention
from attnzoo.models.masking import mask_keywords
from attnzoo.ops.linear.naive import feature_map_fn
from attnzoo.ops.linear.recurrent import init_linear_state

__all__ = ["prefill", "has_prefill"]


def _forward(mixer: nn.Module, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """The causal parallel forward; padding that only trails the real tokens needs no mask (no real token sees it)."""
    if keep is None or not bool((keep[:, 1:] & ~keep[:, :-1]).any()):
        return mixer(x)
    return mixer(x, **mask_keywords(mixer, attention_mask=keep))


def _linear(mixer: LinearAttention, x: torch.Tensor, keep: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
    out = _forward(mixer, x, keep)
    _, k, v = mixer._qkv_grouped(x)  # the state is kept per key/value head
    s, _ = init_linear_state(1, 1, 1, 1, device=x.device, dtype=x.dtype)
    acc = s.dtype  # float32 sums at least, as the recurrent step keeps them
    fk = feature_map_fn(mixer.feature_map)(k.to(acc))
    if keep is not None:
        fk = fk * keep[:, None, :, None].to(acc)
    return out, {"s": torch.einsum("bhtp,bhtv->bhpv", fk, v.to(acc)), "z": fk.sum(dim=2)}


_ADAPTERS: dict[type, Callable[..., tuple[torch.Tensor, Any] | None]] = {
    LinearAttention: _linear,
}


def prefill(mixer: nn.Module, x: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """``(out (B, T, dim), state)``: the causal parallel forward of the prompt ``x (B, T, dim)`` and the decoding
    state after it (what ``step`` would hold after feeding ``x`` token by token); ``attention_mask (B, T)`` marks
    the real tokens. ``None`` when ``mixer`` has no prefill (replay the prompt through ``step`` instead)."""
    if not getattr(mixer, "causal", False):
        return None  # a bidirectional mixer has no decoding state
    own = getattr(mixer, "prefill", None)
    if callable(own):
        return own(x) if attention_mask is None else own(x, attention_mask=attention_mask)
    for cls in type(mixer).__mro__:
        if cls in _ADAPTERS:
            return _ADAPTERS[cls](mixer, x, attention_mask)
    return None


def has_prefill(mixer: nn.Module) -> bool:
    """Whether :func:`prefill` computes ``mixer``'s state from a parallel pass of a (padded) prompt."""
    if not getattr(mixer, "causal", False):
        return False
    return callable(getattr(mixer, "prefill", None)) or any(c in _ADAPTERS for c in type(mixer).__mro__)
