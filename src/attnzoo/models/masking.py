"""Padding masks and packed rows above the layers: the keywords a mixer gets, and padded token-by-token decoding.

A model passes ``attention_mask`` / ``cu_seqlens`` (:mod:`attnzoo.ops._varlen`) to its mixers only when they are
given, so a layer that does not take them still runs unmasked inputs; a mask given to a layer that cannot honour it
(``Attention.supports_masks`` False) is an error naming the mechanism, never silently ignored.

Decoding a padded batch (:func:`masked_step`): a padding token leaves its row's decoding state unchanged and gets a
zero output, so each row's state is that of its real tokens alone, ``S_b(t) = S_b(t-1)`` where ``mask[b, t] = 0``.
A layer whose ``step`` takes ``attention_mask=`` (the ``(B, t + 1)`` mask of every token fed so far, this one last)
does this itself; for the others the rows are selected here, which works for states of a fixed size. Python ints
in a state (a position counter such as ``TSSAState.pos``) become per-row values: rows sharing them step together.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch import nn

from attnzoo.registry import attention_info, list_attentions

__all__ = ["mask_keywords", "masked_step", "masked_mechanisms", "mechanism_name", "RowInts"]


def mechanism_name(mixer: nn.Module) -> str:
    """The registry name of ``mixer``'s mechanism (its class name for unregistered mixers)."""
    return getattr(type(mixer), "registry_name", type(mixer).__name__)


def masked_mechanisms() -> list[str]:
    """The registered mechanisms whose layer honours ``attention_mask`` / ``cu_seqlens``."""
    return [n for n in list_attentions() if getattr(attention_info(n), "supports_masks", False)]


def mask_keywords(
    mixer: nn.Module, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The keywords to pass ``mixer`` (only those given); a clear error when it cannot honour them."""
    kw = {k: v for k, v in (("attention_mask", attention_mask), ("cu_seqlens", cu_seqlens)) if v is not None}
    if kw and not getattr(mixer, "supports_masks", False):
        raise ValueError(
            f"attention {mechanism_name(mixer)!r} does not honour {' / '.join(kw)} yet (its layer has "
            f"supports_masks=False): it would mix padding or other sequences into each one; run sequences of equal "
            f"length without a mask, or use a mechanism that honours masks: {masked_mechanisms()}"
        )
    return kw


@functools.lru_cache(maxsize=None)
def _step_takes_mask(cls: type) -> bool:
    step = getattr(cls, "step", None)
    return step is not None and "attention_mask" in inspect.signature(step).parameters


class RowInts:
    """A Python-int leaf of a decoding state that differs between rows: ``values (B,)`` int64."""

    __slots__ = ("values",)

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def __repr__(self) -> str:
        return f"RowInts({self.values.tolist()})"


def _leaves(state: Any) -> list[Any]:
    out: list[Any] = []
    _map(state, lambda v: out.append(v) or v)
    return out


def _map(state: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` on every leaf (tensor, int, RowInts) of a state made of dicts, (named) tuples and lists."""
    if isinstance(state, dict):
        return {k: _map(v, fn) for k, v in state.items()}
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)._make(_map(v, fn) for v in state)
    if isinstance(state, (list, tuple)):
        return type(state)(_map(v, fn) for v in state)
    if isinstance(state, (torch.Tensor, RowInts)) or (isinstance(state, int) and not isinstance(state, bool)):
        return fn(state)
    return state


def _rows(state: Any, idx: torch.Tensor) -> Any:
    """The rows ``idx`` of a state (its per-row ints as the one value those rows share)."""

    def pick(v: Any) -> Any:
        if isinstance(v, RowInts):
            return int(v.values[idx[0]])
        return v.index_select(0, idx) if isinstance(v, torch.Tensor) else v

    return _map(state, pick)


def _groups(state: Any, real: torch.Tensor) -> list[tuple[torch.Tensor, bool]]:
    """Rows that step together: the same real/padding flag and the same per-row ints, ``[(rows, real)]``."""
    keys = [real.long()] + [v.values for v in _leaves(state) if isinstance(v, RowInts)]
    key = torch.stack(keys, dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    return [((inverse == g).nonzero().flatten(), bool(uniq[g, 0])) for g in range(uniq.shape[0])]


def _merge(parts: list[tuple[torch.Tensor, Any]], batch: int, name: str) -> Any:
    """One state of ``batch`` rows from the states of row groups ``[(rows, state)]``."""
    flat = [_leaves(s) for _, s in parts]
    it = iter(range(len(flat[0])))

    def leaf(template: Any) -> Any:
        i = next(it)
        vals = [f[i] for f in flat]
        if isinstance(template, torch.Tensor):
            if any(v.shape[1:] != template.shape[1:] for v in vals):
                raise ValueError(
                    f"attention {name!r} keeps a decoding state that grows with the tokens (a key/value cache): "
                    f"decoding a padded batch needs its step to take attention_mask= (the mask of the tokens fed "
                    f"so far); decode prompts of equal length, or use a mechanism with a fixed-size state"
                )
            out = template.new_empty((batch,) + tuple(template.shape[1:]))
            for (rows, _), v in zip(parts, vals, strict=True):
                out.index_copy_(0, rows, v.to(out.dtype))
            return out
        ints = [int(v.values[0]) if isinstance(v, RowInts) else int(v) for v in vals]
        if len(set(ints)) == 1:
            return ints[0]
        out = torch.empty(batch, dtype=torch.int64, device=parts[0][0].device)
        for (rows, _), v in zip(parts, ints, strict=True):
            out[rows] = v
        return RowInts(out)

    return _map(parts[0][1], leaf)


def masked_step(mixer: nn.Module, x: torch.Tensor, state: Any, attention_mask: torch.Tensor | None) -> tuple:
    """``mixer.step(x (B, 1, dim), state)`` where ``attention_mask (B, t + 1)`` (1 = real) marks the tokens fed so
    far, this one last: a padding token leaves its row's state unchanged and gets a zero output."""
    if attention_mask is None:
        return mixer.step(x, state)
    if _step_takes_mask(type(mixer)):
        return mixer.step(x, state, attention_mask=attention_mask)
    real = attention_mask[:, -1].bool()
    per_row = any(isinstance(v, RowInts) for v in _leaves(state))
    if not per_row and bool(real.all()):
        return mixer.step(x, state)
    ys = torch.zeros_like(x)
    parts = []
    for rows, is_real in _groups(state, real):
        sub = _rows(state, rows)
        if is_real:
            y, sub = mixer.step(x.index_select(0, rows), sub)
            ys = ys.index_copy(0, rows, y.to(ys.dtype))
        parts.append((rows, sub))
    return ys, _merge(parts, x.shape[0], mechanism_name(mixer))
