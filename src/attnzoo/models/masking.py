"""Padding masks and packed rows above the layers: the keywords a mixer gets, and padded token-by-token decoding.

A model passes ``attention_mask`` / ``cu_seqlens`` (:mod:`attnzoo.ops._varlen`) to its mixers only when they are
given, so a layer that does not take them still runs unmasked inputs; a mask given to a layer that cannot honour it
(``Attention.supports_masks`` False) is an error naming the mechanism, never silently ignored.

Decoding a padded batch (:func:`masked_step`): a padding token leaves its row's decoding state unchanged and gets a
zero output, so each row's state is that of its real tokens alone, ``S_b(t) = S_b(t-1)`` where ``mask[b, t] = 0``.
A layer whose ``step`` takes ``attention_mask=`` (the ``(B, t + 1)`` mask of every token fed so far, this one last)
does this itself; for the others the rows are selected here, which works for states of a fixed size. Python ints
in a state (a position counter such as ``TSSAState.pos``) become per-row values (:class:`RowInts`): the step runs
once per distinct value and each row keeps its own.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch import nn

from attnzoo.registry import attention_info, list_attentions

__all__ = [
    "mask_keywords",
    "masked_step",
    "masked_mechanisms",
    "mechanism_name",
    "step_takes_mask",
    "RowInts",
    "map_state",
]


def mechanism_name(mixer: nn.Module) -> str:
    """The registry name of ``mixer``'s mechanism (its class name for unregistered mixers)."""
    return getattr(type(mixer), "registry_name", type(mixer).__name__)


def masked_mechanisms() -> list[str]:
    """The registered mechanisms whose layer honours ``attention_mask`` / ``cu_seqlens``."""
    return [n for n in list_attentions() if getattr(attention_info(n), "supports_masks", False)]


def mask_keywords(
    mixer: nn.Module, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The keywords to pass ``mixer`` (only those given); a clear error when it cannot honour them (a mask of all
    ones needs no honouring)."""
    kw = {k: v for k, v in (("attention_mask", attention_mask), ("cu_seqlens", cu_seqlens)) if v is not None}
    if kw and not getattr(mixer, "supports_masks", False):
        if cu_seqlens is None and isinstance(attention_mask, torch.Tensor) and bool((attention_mask != 0).all()):
            return {}  # nothing padded: the unmasked forward is exact
        raise ValueError(
            f"attention {mechanism_name(mixer)!r} does not honour {' / '.join(kw)} yet (its layer has "
            f"supports_masks=False): it would mix padding or other sequences into each one; run sequences of equal "
            f"length without a mask, or use a mechanism that honours masks: {masked_mechanisms()}"
        )
    return kw


@functools.lru_cache(maxsize=None)
def step_takes_mask(cls: type) -> bool:
    """Whether ``cls.step`` takes ``attention_mask=`` (the mask of the tokens fed so far) and skips padding itself."""
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
    map_state(state, lambda v: out.append(v) or v)
    return out


def map_state(state: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` on every leaf (tensor, int, RowInts) of a state made of dicts, (named) tuples and lists."""
    if isinstance(state, dict):
        return {k: map_state(v, fn) for k, v in state.items()}
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)._make(map_state(v, fn) for v in state)
    if isinstance(state, (list, tuple)):
        return type(state)(map_state(v, fn) for v in state)
    if isinstance(state, (torch.Tensor, RowInts)) or (isinstance(state, int) and not isinstance(state, bool)):
        return fn(state)
    return state


def _with_ints(state: Any, values: list[int]) -> Any:
    """``state`` with its per-row ints (in leaf order) set to one value each, ``values``."""
    it = iter(values)
    return map_state(state, lambda v: next(it) if isinstance(v, RowInts) else v)


def _select(rows: torch.Tensor, new: Any, old: Any, name: str) -> Any:
    """``new`` at the rows ``rows (B,)`` bool, ``old`` elsewhere, leaf by leaf (ints become per-row where they
    differ)."""
    pairs = iter(list(zip(_leaves(new), _leaves(old), strict=True)))

    def leaf(_: Any) -> Any:
        n, o = next(pairs)
        if isinstance(n, torch.Tensor):
            if n.shape != o.shape:
                raise ValueError(
                    f"attention {name!r} keeps a decoding state that grows with the tokens (a key/value cache): "
                    f"decoding a padded batch needs its step to take attention_mask= (the mask of the tokens fed "
                    f"so far); decode prompts of equal length, or use a mechanism with a fixed-size state"
                )
            return torch.where(rows.view((-1,) + (1,) * (n.ndim - 1)), n, o)
        dev = rows.device
        vals = torch.where(
            rows, torch.as_tensor(n, device=dev), o.values if isinstance(o, RowInts) else torch.as_tensor(o, device=dev)
        )
        return int(vals[0]) if bool((vals == vals[0]).all()) else RowInts(vals)

    return map_state(new, leaf)


def masked_step(mixer: nn.Module, x: torch.Tensor, state: Any, attention_mask: torch.Tensor | None) -> tuple:
    """``mixer.step(x (B, 1, dim), state)`` where ``attention_mask (B, t + 1)`` (1 = real) marks the tokens fed so
    far, this one last: a padding token leaves its row's state unchanged and gets a zero output.

    The step runs on the whole batch (so per-row inputs a wrapper binds, e.g. rotary tables, stay aligned), once
    per distinct value of the state's per-row ints; each row keeps the result of its own value.
    """
    if attention_mask is None:
        return mixer.step(x, state)
    if step_takes_mask(type(mixer)):
        return mixer.step(x, state, attention_mask=attention_mask)
    real = attention_mask[:, -1].bool().to(x.device)
    per_row = [v.values.to(x.device) for v in _leaves(state) if isinstance(v, RowInts)]
    if not per_row and bool(real.all()):
        return mixer.step(x, state)
    name = mechanism_name(mixer)
    if not per_row:
        y, new = mixer.step(x, state)
        return torch.where(real[:, None, None], y, torch.zeros_like(y)), _select(real, new, state, name)
    key = torch.stack(per_row, dim=1)
    ys, out = torch.zeros_like(x), state
    for values in torch.unique(key[real], dim=0).tolist():
        rows = real & (key == torch.tensor(values, device=key.device)).all(dim=1)
        y, new = mixer.step(x, _with_ints(state, values))
        ys = torch.where(rows[:, None, None], y.to(ys.dtype), ys)
        out = _select(rows, new, out, name)
    return ys, out
