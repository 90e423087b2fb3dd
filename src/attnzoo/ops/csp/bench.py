"""Benchmark cases of CSP (declared in the mechanism's ``bench``).

The pair cases group two tokens (K = N/2, CSP §3.2.1's min-max): ``"auto"`` (the fused CPU kernel on CPU), the
PyTorch compare-and-swap path, and the general index-and-gather path it replaces.
"""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.csp import csp as csp_op
from attnzoo.ops.csp import csp_shifts
from attnzoo.ops.csp.parallel import csp_general


def _values(s: Shape, device: torch.device, dtype: torch.dtype):
    (v,) = randn((s.batch, s.length, s.dim), device, dtype)
    return v, csp_shifts(s.length, s.dim, "linear").to(device)


def csp(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    v, shifts = _values(s, device, dtype)
    return [v], lambda: csp_op(v, shifts, 1), 2 * nbytes(v)


def _pairs(name: str, s: Shape, device: torch.device, dtype: torch.dtype):
    if s.length % 2:
        raise ValueError(f"{name} needs an even sequence length, got N={s.length}")
    return _values(s, device, dtype)


def csp_pairs(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    v, shifts = _pairs("csp_pairs", s, device, dtype)
    return [v], lambda: csp_op(v, shifts, s.length // 2, backend="auto"), 2 * nbytes(v)


def csp_pairs_torch(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    v, shifts = _pairs("csp_pairs_torch", s, device, dtype)
    return [v], lambda: csp_op(v, shifts, s.length // 2, backend="torch"), 2 * nbytes(v)


def csp_pairs_general(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    v, shifts = _pairs("csp_pairs_general", s, device, dtype)
    return [v], lambda: csp_general(v, shifts, s.length // 2), 2 * nbytes(v)
