"""Vectorised building blocks for ops that honour :class:`~attnzoo.ops._varlen.Segments` (issue 27).

The naive references run each sequence alone (:func:`run_each_alone`); the fast paths use the helpers below: the
boolean key mask of the quadratic mechanisms (:func:`attention_allowed`), one-hot segment sums
(:func:`segment_onehot`), reading a per-segment matrix at each token (:func:`apply_per_segment`) and zeroing the
padding outputs (:func:`zero_padding`). None loops over sequences, except :func:`run_rows`: a padded batch of few
rows with left/right padding runs the unmasked op on each row's real tokens (B Python steps, no padding work).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from attnzoo.ops._varlen import Segments

__all__ = [
    "run_each_alone",
    "attention_allowed",
    "segment_onehot",
    "apply_per_segment",
    "zero_padding",
    "zero_padding_tokens",
    "real_4d",
    "row_spans",
    "run_rows",
    "run_runs",
    "contiguous_runs",
    "SLICED_ROWS_MAX",
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


#: a padded batch of at most this many rows may run row by row (:func:`row_spans`)
SLICED_ROWS_MAX = 64


def row_spans(seg: Segments) -> list[tuple[int, int]] | None:
    """``(start, end)`` of each row's real tokens when ``seg`` is a padded batch (one sequence per row) of at most
    :data:`SLICED_ROWS_MAX` rows whose real tokens are contiguous (left or right padding), else ``None``; an empty
    row is ``(0, 0)``. One host read."""
    if seg.num != 1 or seg.ids.shape[0] > SLICED_ROWS_MAX:
        return None
    real = seg.real
    n = real.shape[1]
    tok = torch.arange(n, device=real.device)
    first = torch.where(real, tok, n).amin(dim=1)
    last = torch.where(real, tok, -1).amax(dim=1)
    count = real.sum(dim=1)
    rows = torch.stack([first, last, count], dim=1).tolist()
    if any(c and e - f + 1 != c for f, e, c in rows):
        return None  # a hole inside a row
    return [(f, e + 1) if c else (0, 0) for f, e, c in rows]


def contiguous_runs(seg: Segments, packed_max: int) -> list[tuple[int, int, int]] | None:
    """``(row, start, end)`` of every non-empty sequence where :func:`run_runs` may run them one by one on slices:
    a packed row of 2 to ``packed_max`` sequences (from its offsets), a left/right padded batch of at most
    :data:`SLICED_ROWS_MAX` rows (:func:`row_spans`); else ``None``."""
    if seg.offsets is not None:
        o = seg.offsets
        return list(zip([0] * (len(o) - 1), o[:-1], o[1:], strict=True)) if 1 < len(o) - 1 <= packed_max else None
    if seg.num != 1:
        return None
    spans = row_spans(seg)
    return None if spans is None else [(b, a, e) for b, (a, e) in enumerate(spans) if e > a]


def run_rows(
    fn: Callable[..., torch.Tensor], spans: list[tuple[int, int]], tensors: Sequence[torch.Tensor], out_dim: int
) -> torch.Tensor:
    """``fn`` (an unmasked op ``(1, H, n, *) -> (1, H, n, out_dim)``) on each row's real tokens, zero padding
    around them: ``(B, H, N, out_dim)``. The padding is never read (exactly zero gradient) nor computed on; B Python
    steps. Under autograd as slices and concatenations (:func:`run_runs` with ``sliced_grad``)."""
    return run_runs(fn, [(b, a, e) for b, (a, e) in enumerate(spans) if e > a], tensors, out_dim, sliced_grad=True)


Run = tuple[int, int, int]


def run_runs(
    fn: Callable[..., torch.Tensor],
    runs: list[Run],
    tensors: Sequence[torch.Tensor],
    out_dim: int,
    *,
    sliced_grad: bool = False,
) -> torch.Tensor:
    """``fn`` (an unmasked op ``(1, H, n, *) -> (1, H, n, out_dim)``) on each run ``(row b, tokens a..e-1)`` of
    ``tensors`` ``(B, H, N, *)`` (disjoint, in (b, a) order): ``(B, H, N, out_dim)``, zero outside the runs.

    Each run's result is written straight into the output, and backward each run's gradients straight into the
    inputs' (:class:`_RunRuns`): slicing, padding and concatenating under autograd copied every gradient
    several times over (slice backward zero-fills a gradient of the whole input per run), which cost more than
    Fastmax p=1 itself at B = 4, N = 4096 (issue 27). ``sliced_grad``: under autograd, slices and concatenations
    all the same (linear attention's row-by-row backward measured faster so: fwd+bwd 1.10 against 1.2 of the
    unmasked call)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if torch.compiler.is_compiling() or (grad and sliced_grad):
        return _run_runs_functional(fn, runs, tensors, out_dim)
    if grad:
        return _RunRuns.apply(fn, runs, out_dim, *tensors)
    ys = [fn(*(t[b : b + 1, :, a:e] for t in tensors)) for b, a, e in runs]
    return _scatter_runs(ys, runs, tensors[0], out_dim)


def _zero_outside(t: torch.Tensor, runs: list[Run]) -> torch.Tensor:
    """``t`` with the tokens (axis 2) of no run set to 0, in place (only those are written)."""
    row, end = 0, 0
    for b, a, e in [*runs, (t.shape[0], 0, 0)]:  # a sentinel run past the last row closes the rows before it
        while row < b:
            t[row, :, end:].zero_()
            row, end = row + 1, 0
        if a > end:
            t[b, :, end:a].zero_()
        end = e
    return t


def _scatter_runs(ys: list[torch.Tensor], runs: list[Run], x: torch.Tensor, out_dim: int) -> torch.Tensor:
    dtype = ys[0].dtype if ys else x.dtype
    out = _zero_outside(x.new_empty(x.shape[0], x.shape[1], x.shape[2], out_dim, dtype=dtype), runs)
    for y, (b, a, e) in zip(ys, runs, strict=True):
        out[b, :, a:e] = y[0]
    return out


def _run_runs_functional(fn: Callable, runs: list[Run], tensors: Sequence[torch.Tensor], out_dim: int) -> torch.Tensor:
    """:func:`run_runs` as slices and concatenations with zeros (what torch.compile traces)."""
    x = tensors[0]
    ys = [fn(*(t[b : b + 1, :, a:e] for t in tensors)) for b, a, e in runs]
    dtype = ys[0].dtype if ys else x.dtype
    rows, k = [], 0
    for row in range(x.shape[0]):
        pieces, end = [], 0
        while k < len(runs) and runs[k][0] == row:
            _, a, e = runs[k]
            pieces += [x.new_zeros(1, x.shape[1], a - end, out_dim, dtype=dtype), ys[k]]
            end, k = e, k + 1
        pieces.append(x.new_zeros(1, x.shape[1], x.shape[2] - end, out_dim, dtype=dtype))
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows)


class _RunRuns(torch.autograd.Function):
    """:func:`run_runs` under autograd: forward keeps each run's graph (``fn`` on detached views of the inputs),
    backward differentiates each one with the run's slice of the output gradient. First-order only."""

    @staticmethod
    def forward(ctx, fn, runs: list[Run], out_dim: int, *tensors: torch.Tensor) -> torch.Tensor:
        pieces = []
        with torch.enable_grad():
            for b, a, e in runs:
                args = [t[b : b + 1, :, a:e].detach().requires_grad_(t.requires_grad) for t in tensors]
                pieces.append((args, fn(*args)))
        with torch.no_grad():
            out = _scatter_runs([y for _, y in pieces], runs, tensors[0], out_dim)
        ctx.pieces, ctx.runs = pieces, runs
        ctx.metas = [(t.shape, t.dtype, t.device) for t in tensors]
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        needs = ctx.needs_input_grad[3:]
        grads = [
            _zero_outside(torch.empty(shape, dtype=dtype, device=device), ctx.runs) if need else None
            for need, (shape, dtype, device) in zip(needs, ctx.metas, strict=True)
        ]
        want = [i for i, need in enumerate(needs) if need]
        for (b, a, e), (args, y) in zip(ctx.runs, ctx.pieces, strict=True):
            got = torch.autograd.grad(y, [args[i] for i in want], grad_out[b : b + 1, :, a:e], allow_unused=True)
            for i, gi in zip(want, got, strict=True):
                if gi is None:
                    grads[i][b, :, a:e].zero_()
                else:
                    grads[i][b, :, a:e] = gi[0]
        ctx.pieces = None
        return None, None, None, *grads
