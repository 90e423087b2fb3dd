"""CSP token mixer: value projection, channel-wise sample permutation (CSP eq 4), output projection."""

from __future__ import annotations

import torch
from torch import nn

from attnzoo.layers.base import Attention, register_attention
from attnzoo.ops._varlen import segments
from attnzoo.ops.csp import CSP, CSPOptions, csp, csp_shifts, csp_source_index

__all__ = ["CSPAttention"]

#: largest N for which the per-channel permutation indices are recorded while capturing
MAX_RECORD_N = 1024


@register_attention("csp")
class CSPAttention(Attention):
    """CSP in place of MHA: ``y = proj(CSP(x W))`` (CSP §3.2, eq 4); non-causal only.

    Parameters per layer (defaults): ``2·dim² + dim`` — the value projection ``W = v_proj`` (``dim x dim``,
    no bias), the only projection CSP keeps ("except for the projection matrix W corresponding to the value
    matrix, CSP does not require additional projection matrices to construct the query and key matrices",
    §3.2.1), plus the output projection ``proj`` (``dim x dim`` + bias) that the ViT attention block keeps.
    MHA with a bias-free qkv has ``4·dim² + dim``; removing ``2·dim²`` per layer reproduces the CIFAR ViT
    counts of Table 3 (9.52M -> 6.38M at dim 512, depth 6, MLP 512, 64 patches).

    Options: ``groups`` is K of eq 4 (N must be divisible by it; ``groups=1``, complete sorting, accepts
    any N); ``shift_schedule`` one of ``"linear" | "power" | "none"`` (see :func:`attnzoo.ops.csp_shifts`),
    with ``layer_index``/``num_layers`` placing this layer in the power-law schedule across layers;
    ``v_bias``/``proj_bias`` add biases to the two projections; ``proj_dropout`` follows ``proj``.
    ``heads`` is accepted for interface uniformity and otherwise ignored: CSP has one implicit head
    (permutation map ``P_c``) per channel, i.e. ``dim`` heads.

    Recorded internals: ``shifts`` LongTensor ``(dim,)``; ``perm`` LongTensor ``(B, dim, N)`` with
    ``perm[b, c, i] = j`` iff ``P_c[i, j] = 1`` (only when N <= 1024); ``v`` the value matrix ``(B, N, dim)``.
    """

    mechanism = CSP
    supports_masks = True  # forward honours attention_mask / cu_seqlens

    def build(self, o: CSPOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.groups, self.shift_schedule = o.groups, o.shift_schedule
        self.layer_index, self.num_layers = o.layer_index, o.num_layers
        self.v_proj = nn.Linear(self.dim, self.dim, bias=o.v_bias)
        self.proj = nn.Linear(self.dim, self.dim, bias=o.proj_bias)
        self.proj_drop = nn.Dropout(o.proj_dropout)
        self._shift_cache: dict[tuple[int, str], torch.Tensor] = {}

    def shifts_for(self, N: int, device: torch.device | None = None) -> torch.Tensor:
        """The per-channel shift steps ``(dim,)`` used for sequences of N tokens (cached per N and device)."""
        key = (N, str(device))
        s = self._shift_cache.get(key)
        if s is None:
            s = csp_shifts(N, self.dim, self.shift_schedule, layer=self.layer_index, num_layers=self.num_layers).to(
                device
            )
            self._shift_cache[key] = s
        return s

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``(B, N, dim)`` -> ``(B, N, dim)``; with ``attention_mask`` ``(B, N)`` or ``cu_seqlens``
        ``(S + 1,)`` every sequence is permuted alone, with the shift schedule of its own length (zeros at padding).
        """
        self.check_input(x)
        if attention_mask is not None or cu_seqlens is not None:
            return self._forward_segments(x, attention_mask, cu_seqlens)
        N = x.shape[1]
        if N % self.groups != 0:
            valid = [d for d in range(1, N + 1) if N % d == 0]
            raise ValueError(
                f"CSPAttention(groups={self.groups}) needs N divisible by groups, got N={N}; valid groups: {valid}"
            )
        with self.naming_input(x):
            shifts = self.shifts_for(N, x.device)
            v = self.v_proj(x)
            y = csp(v, shifts, self.groups)
            if self.capturing:
                self.record(shifts=shifts, v=v)
                if N <= MAX_RECORD_N:
                    self.record(perm=csp_source_index(v, shifts, self.groups).transpose(1, 2))
            return self.proj_drop(self.proj(y))

    def _forward_segments(self, x, attention_mask, cu_seqlens) -> torch.Tensor:
        """Padded batch or packed row: one shift schedule per sequence (``(B, S, dim)``), as each alone."""
        toks = segments(x.shape[0], x.shape[1], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device)
        lengths = toks.lengths
        # one schedule per distinct length (python ints: the schedules are formulas of N, not tensors)
        shifts = torch.zeros(*lengths.shape, self.dim, dtype=torch.long, device=x.device)
        for n in lengths.unique().tolist():
            if n > 0:
                shifts[lengths == n] = self.shifts_for(int(n), x.device)
        with self.naming_input(x):
            v = self.v_proj(x)
            y = csp(v, shifts, self.groups, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
            if self.capturing:
                self.record(shifts=shifts, v=v)
            return self.proj_drop(self.proj(y)) * toks.real.unsqueeze(-1).to(y.dtype)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, groups={self.groups}, shift_schedule={self.shift_schedule!r}, "
            f"layer_index={self.layer_index}, num_layers={self.num_layers}"
        )
