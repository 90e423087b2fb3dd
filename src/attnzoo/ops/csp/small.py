"""CSP fast path for small groups (CSP eq 4 with G = N / K tokens per group in {1, 2, 3, 4, 8}).

``GSort_K`` sorts each channel inside groups of G tokens. For G = 2 that sort is one compare-and-swap per
(group, channel) (the "min-max" of CSP §3.2.1); for G = 3, 4, 8 a fixed sorting network of 3, 5 and 19
compare-and-swaps. Either is a handful of elementwise passes over the shifted values, O(N) per channel,
instead of an argsort and the int64 index arithmetic of :mod:`attnzoo.ops.csp.parallel`. The circular shift
of eq 3 is applied as two slice copies per channel on CPU (no index tensor), or one gather elsewhere.

Tie rule (as the reference, :mod:`attnzoo.ops.csp.naive`): stable sorts, ties broken by token position,
for the reference channel's ranks and every channel's order alike. The networks compare the keys
``(value, position)`` lexicographically, which totally orders a group's tokens, so they reproduce the
stable sort exactly. Output values never depend on ties; which input a gradient reaches does.

Gradients: the op is a per-(b, c) permutation ``P_c`` of the tokens (eq 5), piecewise constant in ``v``;
its adjoint is the inverse permutation. Only the per-group choices are saved (a bool per pair for G = 2,
a uint8 slot per token otherwise), never an int64 ``(B, N, C)`` index.
"""

from __future__ import annotations

import torch

__all__ = ["SMALL_GROUP_SIZES", "NETWORKS", "csp_small_groups"]

#: comparators (i, j), i < j, after which slot i holds the smaller key: Knuth's optimal networks for 3 and 4
#: inputs, Batcher's odd-even merge sort for 8 (19 comparators, optimal). Verified on all 0/1 inputs in tests.
NETWORKS: dict[int, list[tuple[int, int]]] = {
    3: [(0, 2), (0, 1), (1, 2)],
    4: [(0, 1), (2, 3), (0, 2), (1, 3), (1, 2)],
    8: [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
        (0, 2),
        (1, 3),
        (4, 6),
        (5, 7),
        (1, 2),
        (5, 6),
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
        (2, 4),
        (3, 5),
        (1, 2),
        (3, 4),
        (5, 6),
    ],
}
#: group sizes this path handles (1: pure shifting, groups = N)
SMALL_GROUP_SIZES = (1, 2, *NETWORKS)

# Below this many tokens the per-channel slice copies of the CPU shift cost more in call overhead (two per
# channel) than one gather with an index tensor.
_LOOP_SHIFT_MIN_N = 512

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _use_loop(v: torch.Tensor) -> bool:
    return v.device.type == "cpu" and v.shape[1] >= _LOOP_SHIFT_MIN_N


def _transpose(x: torch.Tensor) -> torch.Tensor:
    """``(B, X, Y) -> (B, Y, X)`` contiguous; per-sample 2-D copies take PyTorch's blocked transpose kernel."""
    out = x.new_empty(x.shape[0], x.shape[2], x.shape[1])
    if x.shape[0] > 8:
        return out.copy_(x.transpose(1, 2))
    for i in range(x.shape[0]):
        out[i].copy_(x[i].t())
    return out


def _roll_rows(x: torch.Tensor, steps: list[int], sign: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[b, c, m] = x[b, c, (m - sign * steps[c]) mod N]`` for ``x (B, C, N)``: two slice copies per channel."""
    n = x.shape[-1]
    out = torch.empty_like(x) if out is None else out
    for ch, j in enumerate(steps):
        j = j if sign > 0 else (n - j) % n
        out[:, ch, j:] = x[:, ch, : n - j]
        if j:
            out[:, ch, :j] = x[:, ch, n - j :]
    return out


def _shift_index(n: int, shifts: torch.Tensor, sign: int) -> torch.Tensor:
    """``(N, C)`` LongTensor ``(m - sign * J_c) mod N``."""
    pos = torch.arange(n, device=shifts.device)
    return torch.remainder(pos[:, None] - sign * shifts[None, :], n)


class _Layout:
    """Where the shifted values live, seen as ``(B, C, K, G)`` (channel, group, slot).

    CPU (``steps`` given): a contiguous ``(B, C, N)`` buffer, since shifting a channel is then two
    contiguous slice copies (moving to and from ``(B, N, C)`` is one blocked transpose each way, cheaper in
    total than shifting strided columns). Elsewhere: ``(B, N, C)`` with the shift as one gather.
    Every elementwise op reads and writes one layout, so none of them is a transposition.
    """

    def __init__(self, shape: torch.Size, g: int, shifts: torch.Tensor, steps: list[int] | None) -> None:
        self.b, self.n, self.c = shape
        self.k, self.g, self.shifts, self.steps = self.n // g, g, shifts, steps

    def empty(self, like: torch.Tensor) -> torch.Tensor:
        if self.steps is not None:
            return like.new_empty(self.b, self.c, self.k, self.g)
        return like.new_empty(self.b, self.k, self.g, self.c).permute(0, 3, 1, 2)

    def shifted(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(S_{J_c} v_c)_c`` of ``v (B, N, C)`` (eq 3) in this layout, and a free tensor of the layout."""
        if self.steps is not None:
            vt = _transpose(v).view(self.b, self.c, self.k, self.g)
            if not any(self.steps):  # schedule "none": nothing to shift
                return vt, self.empty(v)
            u = _roll_rows(vt.view(self.b, self.c, self.n), self.steps, 1).view(self.b, self.c, self.k, self.g)
            return u, vt  # vt is spent: reused for the output
        idx = _shift_index(self.n, self.shifts, 1).expand(self.b, self.n, self.c)
        return self.of_bnc(v.gather(1, idx)), self.empty(v)

    def of_bnc(self, x: torch.Tensor) -> torch.Tensor:
        """A ``(B, N, C)`` tensor in this layout (a view or a transpose)."""
        if self.steps is not None:
            return _transpose(x).view(self.b, self.c, self.k, self.g)
        return x.contiguous().view(self.b, self.k, self.g, self.c).permute(0, 3, 1, 2)

    def to_bnc(self, x4: torch.Tensor, unshift: bool = False, scratch: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, C, K, G)`` in this layout -> ``(B, N, C)``, optionally shifted back by ``-J_c`` on the way
        (into ``scratch``, a free tensor of this layout, if given: big fresh allocations page-fault on CPU)."""
        if self.steps is not None:
            x = x4.view(self.b, self.c, self.n)
            if unshift and any(self.steps):
                x = _roll_rows(x, self.steps, -1, None if scratch is None else scratch.view(self.b, self.c, self.n))
            return _transpose(x)
        x = x4.permute(0, 2, 3, 1).reshape(self.b, self.n, self.c)
        if unshift:
            x = x.gather(1, _shift_index(self.n, self.shifts, -1).expand(self.b, self.n, self.c))
        return x


def _swap_where(swap: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out_x: torch.Tensor, out_y: torch.Tensor) -> None:
    """``out_x = where(swap, y, x)``, ``out_y = where(swap, x, y)``, bit-exact, on the bits of the values.

    ``t = (x ^ y) * swap`` then ``y ^ t`` and ``x ^ t``, computed in the outputs (no temporaries): four
    vectorised integer passes, where two CPU ``torch.where`` calls cost several times as long (N = 16k,
    C = 384). The outputs must not overlap ``x`` or ``y``.
    """
    it = _INT_OF_SIZE[x.element_size()]
    xi, yi, ox, oy = x.view(it), y.view(it), out_x.view(it), out_y.view(it)
    torch.bitwise_xor(xi, yi, out=ox).mul_(swap)
    torch.bitwise_xor(yi, ox, out=oy)
    ox.bitwise_xor_(xi)


def _pair_forward(u: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """G = 2 on ``(B, C, K, 2)`` views: slot 0 takes the pair's smaller value unless the reference pair
    (channel 0) is descending. Returns the swaps ``(B, C, K)``. Strict ``>`` on both sides is the
    stable-sort tie rule: equal values keep their order."""
    a, b = u[..., 0], u[..., 1]
    swap = (a > b) ^ (a[:, :1] > b[:, :1])  # channel descending XOR reference descending
    _swap_where(swap, a, b, out[..., 0], out[..., 1])
    return swap


def _network_forward(u: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """G in NETWORKS on ``(B, C, K, G)`` views: stable sort of every group by the network, then placement by
    the reference channel's ranks. Returns ``src (B, C, K, G)`` uint8: output slot i took the token of slot src."""
    g = u.shape[-1]
    vals = [u[..., i] for i in range(g)]
    pos = [torch.full_like(vals[0], i, dtype=torch.uint8) for i in range(g)]
    for i, j in NETWORKS[g]:
        vi, vj, pi, pj = vals[i], vals[j], pos[i], pos[j]
        # lexicographic (value, position) keys: the network then yields exactly the stable order
        sw = (vi > vj) | ((vi == vj) & (pi > pj))
        vals[i], vals[j] = torch.empty_like(vi), torch.empty_like(vj)
        _swap_where(sw, vi, vj, vals[i], vals[j])
        pos[i], pos[j] = torch.empty_like(pi), torch.empty_like(pj)
        _swap_where(sw, pi, pj, pos[i], pos[j])
    order = torch.stack(pos, dim=-1)  # (B, C, K, G): slot of the r-th smallest, per channel
    bsz, _, k, _ = order.shape
    # rank of each reference slot (inverse of channel 0's order), shared by every channel
    rank_ref = torch.empty(bsz, 1, k, g, dtype=torch.long, device=u.device).scatter_(
        3, order[:, :1].long(), torch.arange(g, device=u.device).expand(bsz, 1, k, g)
    )
    rank = rank_ref.expand_as(order)
    out.copy_(torch.stack(vals, dim=-1).gather(3, rank))
    return order.gather(3, rank)


def _unpack_swaps(bits: torch.Tensor, c: int) -> torch.Tensor:
    """The fused kernel's swaps, int16 ``(B, ceil(C / 16), K)`` with bit j of word ``[b, t, k]`` for channel
    ``16 t + j``, as bools ``(B, C, K)``."""
    lanes = torch.arange(16, device=bits.device, dtype=torch.int32)
    unpacked = (bits.to(torch.int32).unsqueeze(2) >> lanes[:, None]) & 1  # (B, T, 16, K)
    return unpacked.flatten(1, 2)[:, :c].bool()


class _SmallGroupCSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: torch.Tensor, shifts: torch.Tensor, g: int, kernels=None) -> torch.Tensor:
        n = v.shape[1]
        fused = kernels is not None and g == 2
        steps = [j % n for j in shifts.tolist()] if fused or _use_loop(v) else None
        lay = _Layout(v.shape, g, shifts, steps)
        ctx.lay, ctx.kernels = lay, kernels if fused else None
        if fused:  # the C++ kernel; its swaps are bit masks, see _unpack_swaps
            j = torch.tensor(steps, dtype=torch.long)
            # poison (B,): NaN exactly where a sample holds NaN/Inf (the kernel's finiteness check, no extra pass)
            out, swap, poison = kernels.csp_pairs(v.contiguous(), j)
            ctx.save_for_backward(j, swap)
            ctx.mark_non_differentiable(poison)
            return out, poison
        u, out = lay.shifted(v)
        none = v.new_zeros(0)
        ctx.mark_non_differentiable(none)
        if g == 1:  # groups = N: pure shifting
            ctx.save_for_backward(shifts)
            return lay.to_bnc(u), none
        choice = _pair_forward(u, out) if g == 2 else _network_forward(u, out)
        ctx.save_for_backward(shifts, choice)
        return lay.to_bnc(out), none

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _poison):
        lay = ctx.lay
        if ctx.kernels is not None and not torch.is_grad_enabled():  # before any relayout of grad: none is needed
            shifts, choice = ctx.saved_tensors
            return ctx.kernels.csp_pairs_bwd(grad.contiguous(), shifts, choice), None, None, None
        g4 = lay.of_bnc(grad)
        if lay.g == 1:
            return lay.to_bnc(g4, unshift=True), None, None, None
        shifts, choice = ctx.saved_tensors
        if ctx.kernels is not None:
            choice = _unpack_swaps(choice, lay.c)  # (B, C, K), the layout of the double-backward path below
        if torch.is_grad_enabled():
            # double backward (create_graph=True): differentiable ops only, no writes into buffers
            if lay.g == 2:
                a, b = g4[..., 0], g4[..., 1]
                gu = torch.stack([torch.where(choice, b, a), torch.where(choice, a, b)], dim=-1)
            else:
                gu = torch.zeros_like(g4).scatter(3, choice.long(), g4)
            return lay.to_bnc(gu.contiguous(), unshift=True), None, None, None
        gu = lay.empty(grad)
        if lay.g == 2:
            # a transposition is its own inverse: the same swaps send each gradient back to its source
            _swap_where(choice, g4[..., 0], g4[..., 1], gu[..., 0], gu[..., 1])
        else:
            gu.scatter_(3, choice.long(), g4)  # a permutation per group: every slot written exactly once
        return lay.to_bnc(gu, unshift=True, scratch=g4), None, None, None


def csp_small_groups(
    v: torch.Tensor, shifts: torch.Tensor, group_size: int, *, kernels=None, with_poison: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """CSP eq 4 for ``v (B, N, C)`` with groups of ``group_size`` in :data:`SMALL_GROUP_SIZES` tokens.

    ``shifts``: LongTensor ``(C,)`` on ``v.device`` with values in ``[0, N)``. Same values and gradients
    as :func:`attnzoo.ops.csp.parallel.csp_gather` (and the naive reference), tie rule included. ``kernels``
    (``torch.ops.attnzoo_cpu``, CPU tensors): groups of two run in the fused C++ kernel of ``cpu.cpp``;
    ``with_poison`` also returns its ``(B,)`` finiteness flags (NaN where a sample holds NaN/Inf; empty when the
    kernel did not run).
    """
    if group_size not in SMALL_GROUP_SIZES:
        raise ValueError(f"group_size={group_size!r}; the small-group path handles {list(SMALL_GROUP_SIZES)}")
    out, poison = _SmallGroupCSP.apply(v, shifts, group_size, kernels)
    return (out, poison) if with_poison else out
