"""Equal-to-alone checks of padding masks and packed rows, shared by the op tests.

A padded batch (left or right padding) or a packed row (``cu_seqlens``) of several sequences must give, at every
real position, what each sequence gives run alone, forward and backward; padding positions get zero output and
their inputs get zero gradient. Padding is filled with large random values (never zeros), so a path that lets a
padding token into a sum, a sort or a state fails by a wide margin.
"""

from __future__ import annotations

from typing import Callable

import torch

Inputs = dict[str, torch.Tensor]
MODES = ("left", "right", "packed")


def _slots(lengths: list[int], mode: str) -> list[tuple[int, slice]]:
    """(row, token slice) of each sequence in the combined input."""
    if mode == "packed":
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        return [(0, slice(s, s + n)) for s, n in zip(starts, lengths, strict=True)]
    width = max(lengths)
    if mode == "left":
        return [(i, slice(width - n, width)) for i, n in enumerate(lengths)]
    return [(i, slice(0, n)) for i, n in enumerate(lengths)]


def _index(axis: int, row: int, sl: slice) -> tuple:
    return (row,) + (slice(None),) * (axis - 1) + (sl,)


def combine(seqs: list[Inputs], axes: dict[str, int], mode: str, gen: torch.Generator) -> tuple[Inputs, dict]:
    """The sequences (each with batch size 1) as one padded batch or one packed row, and the op's keywords."""
    lengths = [s[next(iter(axes))].shape[axes[next(iter(axes))]] for s in seqs]
    slots = _slots(lengths, mode)
    rows = 1 if mode == "packed" else len(seqs)
    width = sum(lengths) if mode == "packed" else max(lengths)
    out: Inputs = {}
    for name, axis in axes.items():
        ref = seqs[0][name]
        shape = list(ref.shape)
        shape[0], shape[axis] = rows, width
        big = 1e3 * torch.randn(shape, generator=gen, dtype=ref.dtype)  # padding: loud, never zero
        for (row, sl), s in zip(slots, seqs, strict=True):
            big[_index(axis, row, sl)] = s[name][0]
        out[name] = big
    if mode == "packed":
        cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))], dtype=torch.int32)
        return out, {"cu_seqlens": cu}
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for row, sl in slots:
        mask[row, sl] = True
    return out, {"attention_mask": mask}


def assert_equal_to_alone(
    call: Callable[..., torch.Tensor],
    seqs: list[Inputs],
    axes: dict[str, int],
    *,
    mode: str,
    shared: Inputs | None = None,
    out_axis: int = 2,
    rtol: float = 1e-10,
    atol: float = 1e-11,
    backward: bool = True,
    seed: int = 0,
) -> None:
    """``call(**inputs, **keywords)`` on the combined sequences equals ``call`` on each alone (see module doc).

    ``axes``: the token axis of each per-token input (batch axis 0); ``shared``: inputs every sequence uses alike
    (temperatures, biases, representatives of no sequence), whose gradient is the sum over the sequences.
    """
    gen = torch.Generator().manual_seed(seed)
    shared = shared or {}
    lengths = [s[next(iter(axes))].shape[axes[next(iter(axes))]] for s in seqs]
    slots = _slots(lengths, mode)

    # each sequence alone
    alone_leaves = [{k: v.detach().clone().requires_grad_(backward) for k, v in s.items()} for s in seqs]
    shared_alone = {k: v.detach().clone().requires_grad_(backward) for k, v in shared.items()}
    outs = [call(**leaves, **shared_alone) for leaves in alone_leaves]
    cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]

    # together
    combined, kw = combine(seqs, axes, mode, gen)
    together = {k: v.detach().clone().requires_grad_(backward) for k, v in combined.items()}
    shared_together = {k: v.detach().clone().requires_grad_(backward) for k, v in shared.items()}
    out = call(**together, **shared_together, **kw)
    real = torch.zeros(out.shape, dtype=torch.bool)
    cot = torch.zeros_like(out)
    for (row, sl), o, c in zip(slots, outs, cots, strict=True):
        idx = _index(out_axis, row, sl)
        torch.testing.assert_close(out[idx], o[0], rtol=rtol, atol=atol, msg=lambda m: f"{mode}, forward: {m}")
        real[idx] = True
        cot[idx] = c[0]
    assert bool((out.detach()[~real] == 0).all()), f"{mode}: padding positions must give zero output"
    if not backward:
        return

    grads_alone = [
        # the graphs stay for the shared inputs' gradient below
        torch.autograd.grad((o * c).sum(), list(leaves.values()), allow_unused=True, retain_graph=bool(shared))
        for o, c, leaves in zip(outs, cots, alone_leaves, strict=True)
    ]
    shared_grads = (
        torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cots, strict=True)), list(shared_alone.values()))
        if shared
        else []
    )
    names = list(together)
    got = torch.autograd.grad((out * cot).sum(), [together[n] for n in names] + list(shared_together.values()))
    for name, g in zip(names, got[: len(names)], strict=True):
        axis = axes[name]
        pad = torch.ones(g.shape, dtype=torch.bool)
        for (row, sl), ga in zip(slots, grads_alone, strict=True):
            idx = _index(axis, row, sl)
            want = ga[names.index(name)]
            want = torch.zeros_like(g[idx]) if want is None else want[0]
            torch.testing.assert_close(g[idx], want, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{mode}, d{n}: {m}")
            pad[idx] = False
        assert bool((g[pad] == 0).all()), f"{mode}: padding tokens of {name} must get zero gradient"
    for name, g, want in zip(shared, got[len(names) :], shared_grads, strict=True):
        torch.testing.assert_close(g, want, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{mode}, d{n}: {m}")
