"""Tensor validation shared by the ops on ``(B, H, N, P)`` tensors (softmax, linear, xca, mssa)."""

from __future__ import annotations

from typing import Sequence

import torch

from attnzoo._checks import check_ndim, finite_absmax

__all__ = ["check_tensors", "check_qkv"]

_LAYOUT = "(B, H, N, P)"


def check_tensors(names: Sequence[str], tensors: Sequence[torch.Tensor], op: str = "") -> dict[str, float]:
    """Each tensor is a floating ``(B, H, N, P)`` tensor; all share dtype, device, ``B`` and ``H``; all finite.

    Returns ``{name: max |tensor|}`` (one host sync for all of them; empty while tracing) for overflow bounds.
    """
    for n, t in zip(names, tensors, strict=True):
        check_ndim(n, t, 4, _LAYOUT)
    ref_name, ref = names[0], tensors[0]
    for n, t in zip(names[1:], tensors[1:], strict=True):
        if t.dtype != ref.dtype:
            raise TypeError(f"{ref_name} and {n} must share a dtype, got {ref.dtype} and {t.dtype}")
        if t.device != ref.device:
            raise ValueError(f"{ref_name} and {n} must be on one device, got {ref.device} and {t.device}")
        if t.shape[:2] != ref.shape[:2]:
            raise ValueError(f"{ref_name} and {n} must agree on (B, H): got {tuple(ref.shape)} and {tuple(t.shape)}")
    for n, t in zip(names, tensors, strict=True):
        if t.shape[-2] < 1 or t.shape[-1] < 1:
            raise ValueError(f"{n} must hold at least one token and one channel, got shape {tuple(t.shape)}")
    return finite_absmax(dict(zip(names, tensors, strict=True)), op=op)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, op: str, same_n: bool) -> dict[str, float]:
    """:func:`check_tensors` of ``q, k, v`` and their sizes: ``q (B, H, Nq, P)`` and ``k (B, H, Nk, P)`` share the
    head size, ``k`` and ``v (B, H, Nk, Pv)`` the token count, and with ``same_n`` every one of them (``Nq == Nk``)."""
    absmax = check_tensors(("q", "k", "v"), (q, k, v), op=op)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head size P: got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2] or (same_n and q.shape[-2] != k.shape[-2]):
        which = "q, k and v" if same_n else "k and v"
        raise ValueError(
            f"{which} must hold the same number of tokens N: got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    return absmax
