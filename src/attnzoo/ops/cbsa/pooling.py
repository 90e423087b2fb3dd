"""Representative initialisation for CBSA: average pooling of the projected tokens (Q_ini of eq 5).

Prefix tokens (CLS, registers, ...) are the first ``num_prefix_tokens`` tokens and are excluded from
pooling explicitly. (The paper's Algorithm 1 instead drops the *last* token, ``w[:, :-1]``, which silently
depends on where the CLS token sits; we never slice by position implicitly.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

from attnzoo._checks import check_ndim, check_positive_int
from attnzoo.ops._varlen import segments
from attnzoo.ops.cbsa.varlen import pool_window_weights

__all__ = ["pool_reps", "pool_reps_1d", "pool_reps_2d", "pool_reps_varlen", "DEFAULT_NUM_REPS", "DEFAULT_REP_GRID"]

#: 1-D default: number of representatives (the paper's m = p = 64 for CBT models).
DEFAULT_NUM_REPS = 64
#: 2-D default: representatives grid of Algorithm 1 (``AdaptiveAvgPool2d((8, 8))``), clipped to the token grid.
DEFAULT_REP_GRID = (8, 8)


def _check_prefix(num_prefix_tokens: int) -> None:
    if not isinstance(num_prefix_tokens, int) or isinstance(num_prefix_tokens, bool) or num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be a non-negative integer, got {num_prefix_tokens!r}")


def _check_grid(name: str, grid) -> tuple[int, int]:
    if (
        not isinstance(grid, (tuple, list))
        or len(grid) != 2
        or any(not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in grid)
    ):
        raise ValueError(f"{name} must be a pair of positive integers (height, width), got {grid!r}")
    return int(grid[0]), int(grid[1])


def _body(w: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    check_ndim("w", w, 4, "(B, H, N, P)")
    _check_prefix(num_prefix_tokens)
    n = w.shape[-2]
    if n - num_prefix_tokens < 1:
        raise ValueError(
            f"no non-prefix tokens to pool: N={n} tokens with num_prefix_tokens={num_prefix_tokens}; "
            f"need N > num_prefix_tokens"
        )
    return w[..., num_prefix_tokens:, :]


def pool_reps_1d(w: torch.Tensor, num_reps: int = DEFAULT_NUM_REPS, *, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Q_ini of eq 5 for a 1-D sequence: adaptive average pooling of the non-prefix tokens.

    ``w``: ``(B, H, N, P)``; returns ``(B, H, M, P)`` with ``M = min(num_reps, N - num_prefix_tokens)``
    (representative ``i`` averages the tokens in window ``[floor(i*L/M), ceil((i+1)*L/M))`` of the
    ``L = N - num_prefix_tokens`` body tokens, as ``torch.nn.AdaptiveAvgPool1d``).
    """
    check_positive_int("num_reps", num_reps)
    body = _body(w, num_prefix_tokens)
    m = min(num_reps, body.shape[-2])
    return window_means(body, m)


def window_means(x: torch.Tensor, m: int) -> torch.Tensor:
    """``AdaptiveAvgPool1d`` along the token axis: ``x (..., L, P)`` -> ``(..., m, P)``, window ``i`` the tokens
    ``[floor(i L / m), ceil((i + 1) L / m))``.

    Written with a reshape (``m`` divides ``L``) or a window matrix rather than ``F.adaptive_avg_pool1d``: CUDA's
    adaptive pooling backward fails for long windows (an internal launch-bounds assert seen at L = 65536, m = 64
    on an H200), and both forms have plain backward passes.
    """
    n_tok = x.shape[-2]
    if n_tok % m == 0:
        return x.unflatten(-2, (m, n_tok // m)).mean(-2)
    i = torch.arange(m, device=x.device)
    start, end = (i * n_tok) // m, ((i + 1) * n_tok + m - 1) // m
    tok = torch.arange(n_tok, device=x.device)
    inside = (tok >= start[:, None]) & (tok < end[:, None])
    weights = inside.to(x.dtype) / (end - start).to(x.dtype)[:, None]
    return torch.einsum("ml,...lp->...mp", weights, x)


def refuse_masks_2d(grid, attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> None:
    """Raise if masks come with 2-D pooling: padded or packed tokens are no ``(Hg, Wg)`` image to pool."""
    if attention_mask is None and cu_seqlens is None:
        return
    given = "attention_mask" if attention_mask is not None else "cu_seqlens"
    raise ValueError(
        f"CBSA's 2-D pooling (grid={grid!r}) does not take attention_mask / cu_seqlens (got {given}): padded or "
        "packed tokens are no image grid. What works: 2-D pooling without masks (whole images), or 1-D pooling "
        "(grid=None, num_reps=M; pool_reps_varlen) for padded or packed sequences"
    )


def pool_reps_2d(
    w: torch.Tensor,
    grid: tuple[int, int],
    rep_grid: tuple[int, int] | None = None,
    *,
    num_prefix_tokens: int = 0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Q_ini of eq 5 for a 2-D token grid: adaptive 2-D average pooling of the non-prefix tokens.

    ``w``: ``(B, H, N, P)`` whose tokens after the prefix are a row-major ``grid = (Hg, Wg)`` image
    (``N = num_prefix_tokens + Hg * Wg``); returns ``(B, H, Mh * Mw, P)`` in row-major order of
    ``rep_grid = (Mh, Mw)`` (default ``(min(8, Hg), min(8, Wg))``, Algorithm 1's 8x8 clipped to the grid).
    ``attention_mask`` / ``cu_seqlens`` are refused (a padded image is no grid): see :func:`refuse_masks_2d`.
    """
    refuse_masks_2d(grid, attention_mask, cu_seqlens)
    gh, gw = _check_grid("grid", grid)
    if rep_grid is None:
        rep_grid = (min(DEFAULT_REP_GRID[0], gh), min(DEFAULT_REP_GRID[1], gw))
    rh, rw = _check_grid("rep_grid", rep_grid)
    body = _body(w, num_prefix_tokens)
    n_body = body.shape[-2]
    if gh * gw != n_body:
        raise ValueError(
            f"grid={tuple(grid)} holds {gh * gw} tokens but the input has {n_body} non-prefix tokens "
            f"(N={w.shape[-2]}, num_prefix_tokens={num_prefix_tokens}); need N = num_prefix_tokens + Hg * Wg"
        )
    h = w.shape[1]
    img = rearrange(body, "b h (y x) p -> (b h) p y x", y=gh, x=gw)
    pooled = F.adaptive_avg_pool2d(img, (rh, rw))
    return rearrange(pooled, "(b h) p y x -> b h (y x) p", h=h)


def pool_reps(
    w: torch.Tensor,
    *,
    num_reps: int | None = None,
    grid: tuple[int, int] | None = None,
    rep_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Average-pooling initialisation Q_ini of eq 5: 2-D when ``grid`` is given, else 1-D.

    ``w``: ``(B, H, N, P)`` -> ``(B, H, M, P)``. 1-D: ``M = min(num_reps or 64, N - num_prefix_tokens)``.
    2-D: ``M = prod(rep_grid)``; ``num_reps`` must then be left ``None`` (use ``rep_grid``). ``attention_mask`` /
    ``cu_seqlens`` are refused, naming what takes them (:func:`pool_reps_varlen`, 1-D).
    """
    if attention_mask is not None or cu_seqlens is not None:
        if grid is not None:
            refuse_masks_2d(grid, attention_mask, cu_seqlens)
        raise ValueError(
            "pool_reps does not take attention_mask / cu_seqlens (its reps would not say which sequence they belong "
            "to); use pool_reps_varlen(w, num_reps, attention_mask=..., cu_seqlens=...), which returns the reps and "
            "the keywords for cbsa"
        )
    if grid is None:
        if rep_grid is not None:
            raise ValueError(f"rep_grid={rep_grid!r} needs a token grid; pass grid=(Hg, Wg) too, or use num_reps")
        return pool_reps_1d(w, DEFAULT_NUM_REPS if num_reps is None else num_reps, num_prefix_tokens=num_prefix_tokens)
    if num_reps is not None:
        raise ValueError(
            f"num_reps={num_reps!r} applies to 1-D pooling only; with grid={grid!r} set the representatives "
            f"with rep_grid=(Mh, Mw)"
        )
    return pool_reps_2d(w, grid, rep_grid, num_prefix_tokens=num_prefix_tokens)


def pool_reps_varlen(
    w: torch.Tensor,
    num_reps: int = DEFAULT_NUM_REPS,
    *,
    num_prefix_tokens: int = 0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """1-D Q_ini of eq 5 per sequence of a padded batch or packed row: each sequence's reps as it alone would get.

    ``w``: ``(B, H, N, P)``; returns ``reps`` ``(B, H, K, P)`` and the keywords telling :func:`cbsa` which reps
    belong to which sequence (``reps_attention_mask`` ``(B, K)`` or ``reps_cu_seqlens`` ``(S + 1,)``). Sequence
    ``s`` gets ``min(num_reps, L_s - num_prefix_tokens)`` reps, the window means of :func:`pool_reps_1d` over its
    own real tokens; padded rows are right-padded with zero slots that take no part.
    """
    check_ndim("w", w, 4, "(B, H, N, P)")
    check_positive_int("num_reps", num_reps)
    _check_prefix(num_prefix_tokens)
    toks = segments(w.shape[0], w.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=w.device)
    if toks is None:
        raise ValueError("pool_reps_varlen needs attention_mask or cu_seqlens (else use pool_reps_1d)")
    weights, seq, m = pool_window_weights(toks, num_reps, num_prefix_tokens, w.dtype)
    reps = torch.einsum("bkn,bhnp->bhkp", weights, w)
    if cu_seqlens is not None:
        offsets = torch.cat([m.new_zeros(1), m[0].cumsum(0)])
        return reps, {"reps_cu_seqlens": offsets}
    return reps, {"reps_attention_mask": seq >= 0}
