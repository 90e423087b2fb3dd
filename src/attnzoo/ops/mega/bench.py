"""Benchmark cases of MEGA's token mixing (declared in the mechanism's ``bench``).

Single-head: ``heads`` plays no part. The EMA over the ``d`` channels with ``h = 16`` (bidirectional, or causal), or
the attention on ``Z = min(64, d)`` and ``E = 2 d`` (MEGA's LRA ratios): full softmax, chunks of 128 (MEGA-chunk),
or CSP on the value (complete sorting, CSP Table 7).
"""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.csp import csp as csp_op
from attnzoo.ops.ema import ema as ema_op
from attnzoo.ops.mega import mega_attention

#: Mega-chunk's r on LRA (attnzoo.models.zoo.MEGA_CHUNK)
MEGA_CHUNK = 128


def ema(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    (x,) = randn((s.batch, s.length, s.dim), device, dtype)
    lead = (s.dim, 16) if causal else (2, s.dim, 16)
    a, d = (torch.rand(lead, device=device, dtype=dtype) * 0.9 + 0.05 for _ in range(2))
    b, e = randn(lead, device, dtype, 2)
    return [x], lambda: ema_op(x, a, d, b, e, causal=causal), 2 * nbytes(x)


def _attention(name: str, s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    if causal:
        raise ValueError(f"{name!r} has no causal form (MEGA's encoder attention); run it with causal=False")
    z, e = min(64, s.dim), 2 * s.dim
    (v,) = randn((s.batch, s.length, e), device, dtype)
    if name == "mega_csp":
        shifts = torch.zeros(e, dtype=torch.long, device=device)  # K = 1: complete sorting makes shifts redundant
        return [v], lambda: csp_op(v, shifts, 1), 2 * nbytes(v)
    q, k = randn((s.batch, s.length, z), device, dtype, 2)
    chunk = MEGA_CHUNK if name == "mega_chunk" else None
    bias = torch.zeros(2 * (chunk or s.length) - 1, device=device, dtype=dtype)
    return [q, k, v], lambda: mega_attention(q, k, v, bias, chunk_size=chunk), nbytes(q, k) + 2 * nbytes(v)


def mega(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    return _attention("mega", s, causal, device, dtype)


def mega_chunk(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    return _attention("mega_chunk", s, causal, device, dtype)


def mega_csp(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    return _attention("mega_csp", s, causal, device, dtype)


def sized(options: dict, length: int, dim: int, _causal: bool) -> dict:
    """The whole MEGA layer (EMA, gates, projections) with MEGA's LRA widths relative to d (E = 2d)."""
    options = dict(options, zdim=min(64, dim))
    if "chunk_size" not in options and options["attention"] != "csp":
        options["max_len"] = max(1024, length)  # the relative bias spans the sequence
    return options
