"""CBSA on padded batches and packed rows: every sequence mixes only with its own tokens and reps.

Tokens carry sequence ids ``tok`` ``(B, N)`` and representatives ``rep`` ``(B, M)`` (``-1``: padding / an unused
slot), from :func:`attnzoo.ops._varlen.segments` on the token grid and on the representatives' grid. Per sequence
``s`` (tokens ``T_s``, representatives ``M_s``) the op is the unmasked one on that sequence alone:
``A^T = softmax_{n in T_s}(reps_m w_n^T * scale)`` (eq 5), the contraction among ``M_s`` only (eq 7/8, eq 7 with
``m = |M_s|``), the broadcast ``out_n = sum_{m in M_s} A_nm C_m``; "mssa" / "linear" / "channel" use the
sequence's own Gram ``sum_{n in T_s} w_n^T w_n`` (eqs 9, 12, 13). Everything is vectorised with segment masks and
one-hot segment sums (no loop over sequences, no padding to a common length); padding tokens give zero output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._varlen import Segments

__all__ = ["cbsa_varlen", "pool_window_weights"]


def _mT(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def _masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis among ``allowed``; rows with nothing allowed give zeros (not NaN)."""
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * allowed


def _one_hot(ids: torch.Tensor, num: int, dtype: torch.dtype) -> torch.Tensor:
    """``(B, L, S)``: 1 where item ``l`` belongs to sequence ``s`` (padding, id -1, matches none)."""
    return (ids.unsqueeze(-1) == torch.arange(num, device=ids.device)).to(dtype)


def _segment_solve(x: torch.Tensor, oh: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Row form of eq 7 per sequence through push-through: ``x_l (I_P + c_s sum_{l' in s} x_l'^T x_l')^{-1}``.

    ``x`` ``(B, H, L, P)``, ``oh`` ``(B, L, S)`` one-hot of each row's sequence, ``coef`` ``(B, S)`` the c_s."""
    p = x.shape[-1]
    gram = torch.einsum("bls,bhlp,bhlq->bhspq", oh, x, x)  # per-sequence P x P Gram (one-hot segment sums)
    eye = torch.eye(p, dtype=x.dtype, device=x.device)
    kinv = torch.cholesky_inverse(torch.linalg.cholesky(eye + coef[:, None, :, None, None] * gram))
    return torch.einsum("bls,bhlp,bhspq->bhlq", oh, x, kinv)


def _extract_contract_broadcast(w, reps, tok, rep, num, *, variant, contraction, eps, scale, eta):
    """Eqs 5, 7/8 and the broadcast for "cbsa" / "agent" with tokens and reps confined to their sequence."""
    p = w.shape[-1]
    allowed = (rep.unsqueeze(-1) == tok.unsqueeze(-2)) & (tok >= 0).unsqueeze(-2)  # (B, M, N)
    attn = _masked_softmax((reps @ _mT(w)) * scale, allowed.unsqueeze(1))  # (B, H, M, N) = A_k^T
    R = reps + eta * (attn @ w)
    live = (rep >= 0).to(w.dtype)[:, None, :, None]  # unused representative slots take no part
    if variant == "agent":
        C = R
    elif contraction == "softmax":
        same = (rep.unsqueeze(-1) == rep.unsqueeze(-2)) & (rep >= 0).unsqueeze(-1)
        C = _masked_softmax((R @ _mT(R)) * scale, same.unsqueeze(1)) @ R
    else:
        oh = _one_hot(rep, num, w.dtype)
        count = oh.sum(1)  # |M_s|
        C = _segment_solve(R * live, oh, p / (count.clamp_min(1) * eps**2))
    return _mT(attn) @ (C * live)


def cbsa_varlen(
    w: torch.Tensor,
    reps: torch.Tensor | None,
    toks: Segments,
    reps_seg: Segments | None,
    *,
    variant: str,
    contraction: str | None,
    eps: float,
    scale: float,
    eta,
) -> torch.Tensor:
    """CBSA per sequence (module doc); ``w`` ``(B, H, N, P)`` zero at padding -> ``(B, H, N, P)``."""
    p = w.shape[-1]
    tok, num = toks.ids, toks.num
    real = (tok >= 0).to(w.dtype)[:, None, :, None]
    if variant in ("cbsa", "agent"):
        out = _extract_contract_broadcast(
            w, reps, tok, reps_seg.ids, num, variant=variant, contraction=contraction, eps=eps, scale=scale, eta=eta
        )
    elif variant == "mssa" and contraction == "softmax":
        same = (tok.unsqueeze(-1) == tok.unsqueeze(-2)) & (tok >= 0).unsqueeze(-1)
        # a padding query may see itself only: a finite row, zeroed below
        same = same | torch.eye(tok.shape[-1], dtype=torch.bool, device=tok.device)
        out = F.scaled_dot_product_attention(w, w, w, attn_mask=same.unsqueeze(1), scale=scale)
    elif variant in ("mssa", "linear"):
        oh = _one_hot(tok, num, w.dtype)
        if variant == "mssa":  # eq 7 with m = N_s tokens as their own representatives
            coef = p / (toks.lengths.to(w.dtype).clamp_min(1) * eps**2)
        else:  # eq 12: (I + W_s^T W_s / eps^2)^{-1}
            coef = torch.full((tok.shape[0], num), 1.0 / eps**2, dtype=w.dtype, device=w.device)
        out = _segment_solve(w, oh, coef)
    elif variant == "channel":
        oh = _one_hot(tok, num, w.dtype)
        moment = torch.einsum("bns,bhnp->bhsp", oh, w * w)  # eq 13: second moment over the sequence's tokens
        out = w * torch.einsum("bns,bhsp->bhnp", oh, eps**2 / (eps**2 + moment))
    else:  # pragma: no cover
        raise AssertionError(f"unvalidated variant {variant!r}")
    return out * real


def pool_window_weights(
    toks: Segments, num_reps: int, num_prefix_tokens: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Window means of :func:`~attnzoo.ops.cbsa.pooling.window_means` per sequence, as one weight matrix.

    Sequence ``s`` with ``L_s`` body tokens (after its own first ``num_prefix_tokens``) gets
    ``m_s = min(num_reps, L_s)`` representatives, rep ``i`` the mean over body positions
    ``[floor(i L_s / m_s), ceil((i + 1) L_s / m_s))``, exactly as the sequence alone. Returns ``weights``
    ``(B, K, N)``, the representatives' sequence ids ``(B, K)`` (-1: unused slot) and ``m`` ``(B, S)``.
    """
    body = toks.lengths - num_prefix_tokens  # (B, S)
    if bool(((toks.lengths > 0) & (body < 1)).any()):
        raise ValueError(
            f"no non-prefix tokens to pool in some sequence: every sequence needs more than "
            f"num_prefix_tokens={num_prefix_tokens} tokens, got lengths {toks.lengths.tolist()}"
        )
    m = body.clamp(0, num_reps)  # (B, S)
    ends = m.cumsum(-1)
    k_max = max(int(ends[:, -1].max()), 1)
    k = torch.arange(k_max, device=m.device).expand(m.shape[0], k_max).contiguous()
    seq = torch.searchsorted(ends, k, right=True)  # (B, K)
    used = seq < m.shape[1]
    seq = seq.clamp_max(m.shape[1] - 1)
    i = k - (ends - m).gather(1, seq)
    L, ms = body.gather(1, seq), m.gather(1, seq).clamp_min(1)
    start, end = (i * L) // ms, ((i + 1) * L + ms - 1) // ms
    bpos = (toks.pos - num_prefix_tokens).unsqueeze(1)  # (B, 1, N): prefix tokens fall before every window
    inside = (toks.ids.unsqueeze(1) == seq.unsqueeze(-1)) & (bpos >= start.unsqueeze(-1)) & (bpos < end.unsqueeze(-1))
    inside = inside & used.unsqueeze(-1)
    weights = inside.to(dtype) / (end - start).clamp_min(1).to(dtype).unsqueeze(-1)
    return weights, torch.where(used, seq, -1), m
