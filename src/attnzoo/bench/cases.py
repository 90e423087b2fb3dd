"""What the benchmark runs: each mechanism as a pure op on per-head tensors, or as its full module.

An op case returns the inputs it needs and the bytes an ideal implementation must move (read every
input once, write the output once); that byte count is the roofline reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from attnzoo import ops
from attnzoo.bench import baselines


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    length: int
    dim: int  # model width d = heads * head_dim

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass
class Prepared:
    inputs: list[torch.Tensor]  # tensors that receive gradients in the fwd+bwd measurement
    run: Callable[[], torch.Tensor]
    bytes_moved: int


def _randn(shape, device, dtype, n=1):
    return [torch.randn(*shape, device=device, dtype=dtype) for _ in range(n)]


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _baseline_op_case(name: str, s: Shape, causal: bool, device, dtype) -> Prepared:
    B, H, N, P = s.batch, s.heads, s.length, s.head_dim
    mech, opts = baselines.BASELINE_CASES[name]
    if mech == "fastmax":
        q, k, v = _randn((B, H, N, P), device, dtype, 3)
        run = lambda: baselines.fastmax_baseline(q, k, v, p=opts["p"], causal=causal)  # noqa: E731
        return Prepared([q, k, v], run, 4 * _nbytes(q))
    (w,) = _randn((B, H, N, P), device, dtype)
    temp = torch.ones(H, device=device, dtype=dtype)
    bias = torch.zeros(H, N, 1, device=device, dtype=dtype) if causal else None
    run = lambda: baselines.tssa_baseline(w, temp, causal=causal, bias=bias)  # noqa: E731
    return Prepared([w], run, 2 * _nbytes(w))


def _op_case(name: str, s: Shape, causal: bool, device, dtype) -> Prepared:
    B, H, N, P = s.batch, s.heads, s.length, s.head_dim
    if name in BASELINE_CASES:
        return _baseline_op_case(name, s, causal, device, dtype)
    if name in ("softmax", "softmax_explicit", "linear", "xca") or name.startswith("fastmax_p"):
        q, k, v = _randn((B, H, N, P), device, dtype, 3)
        if name == "softmax":
            run = lambda: ops.softmax_attention(q, k, v, causal=causal)  # noqa: E731
        elif name == "softmax_explicit":
            # the N x N scores and weights materialised (the reference): the attention the papers' memory
            # figures compare against, where SDPA streams the scores
            run = lambda: ops.softmax_attention(q, k, v, causal=causal, backend="naive")  # noqa: E731
        elif name == "linear":
            run = lambda: ops.linear_attention(q, k, v, causal=causal)  # noqa: E731
        elif name == "xca":
            temp = torch.ones(H, device=device, dtype=dtype)
            run = lambda: ops.xca(q, k, v, temp)  # noqa: E731
        else:
            p = int(name[len("fastmax_p")])
            # "_autograd": autograd through the same chunked factorisation, the memory reference of FAST §2.5
            backend = "torch_autograd" if name.endswith("_autograd") else "auto"
            run = lambda: ops.fastmax(q, k, v, p=p, causal=causal, backend=backend)  # noqa: E731
        return Prepared([q, k, v], run, 4 * _nbytes(q))
    if name in ("tssa", "tssa_torch", "mssa"):
        (w,) = _randn((B, H, N, P), device, dtype)
        if name == "mssa":
            run = lambda: ops.mssa(w, causal=causal, normalize_query=causal)  # noqa: E731
            return Prepared([w], run, 2 * _nbytes(w))
        temp = torch.ones(H, device=device, dtype=dtype)
        bias = torch.zeros(H, N, 1, device=device, dtype=dtype) if causal else None
        # "tssa_torch": the PyTorch path, to measure what the fused CPU kernels ("auto" on CPU) gain
        backend = "torch" if name == "tssa_torch" else "auto"
        run = lambda: ops.tssa(w, temp, causal=causal, bias=bias, backend=backend)  # noqa: E731
        return Prepared([w], run, 2 * _nbytes(w))
    if name == "cbsa":
        (w,) = _randn((B, H, N, P), device, dtype)
        from attnzoo.ops.cbsa.pooling import pool_reps

        # representatives pooled from the tokens inside the timed call, as the module does (M = 64)
        run = lambda: ops.cbsa(w, pool_reps(w, num_reps=64))  # noqa: E731
        return Prepared([w], run, 2 * _nbytes(w))
    if name == "csp":
        (v,) = _randn((B, N, s.dim), device, dtype)
        shifts = ops.csp_shifts(N, s.dim, "linear").to(device)
        run = lambda: ops.csp(v, shifts, 1)  # noqa: E731
        return Prepared([v], run, 2 * _nbytes(v))
    if name in CSP_PAIR_CASES:
        # CSP with groups of two tokens (K = N/2, CSP §3.2.1's min-max): "auto" (the fused CPU kernel on CPU),
        # the PyTorch compare-and-swap path, and the general index-and-gather path it replaces
        if N % 2:
            raise ValueError(f"{name} needs an even sequence length, got N={N}")
        (v,) = _randn((B, N, s.dim), device, dtype)
        shifts = ops.csp_shifts(N, s.dim, "linear").to(device)
        if name == "csp_pairs_general":
            from attnzoo.ops.csp.gather import csp_general

            run = lambda: csp_general(v, shifts, N // 2)  # noqa: E731
        else:
            backend = "torch" if name == "csp_pairs_torch" else "auto"
            run = lambda: ops.csp(v, shifts, N // 2, backend=backend)  # noqa: E731
        return Prepared([v], run, 2 * _nbytes(v))
    if name in MEGA_CASES:
        return _mega_op_case(name, s, causal, device, dtype)
    raise ValueError(f"no op-level benchmark case for {name!r}; valid: {ALL_OP_CASES}")


def _mega_op_case(name: str, s: Shape, causal: bool, device, dtype) -> Prepared:
    """MEGA's token mixing as its ops (single-head: ``heads`` plays no part): the EMA over the ``d`` channels with
    ``h = 16`` (bidirectional, or causal), or the attention on ``Z = min(64, d)`` and ``E = 2 d`` (MEGA's LRA
    ratios): full softmax, chunks of 128 (MEGA-chunk), or CSP on the value (complete sorting, CSP Table 7)."""
    B, N, D = s.batch, s.length, s.dim
    if name == "ema":
        (x,) = _randn((B, N, D), device, dtype)
        lead = (D, 16) if causal else (2, D, 16)
        a, d = (torch.rand(lead, device=device, dtype=dtype) * 0.9 + 0.05 for _ in range(2))
        b, e = _randn(lead, device, dtype, 2)
        run = lambda: ops.ema(x, a, d, b, e, causal=causal)  # noqa: E731
        return Prepared([x], run, 2 * _nbytes(x))
    if causal:
        raise ValueError(f"{name!r} has no causal form (MEGA's encoder attention); run it with causal=False")
    Z, E = min(64, D), 2 * D
    (v,) = _randn((B, N, E), device, dtype)
    if name == "mega_csp":
        shifts = torch.zeros(E, dtype=torch.long, device=device)  # K = 1: complete sorting makes shifts redundant
        run = lambda: ops.csp(v, shifts, 1)  # noqa: E731
        return Prepared([v], run, 2 * _nbytes(v))
    q, k = _randn((B, N, Z), device, dtype, 2)
    chunk = MEGA_CHUNK if name == "mega_chunk" else None
    bias = torch.zeros(2 * (chunk or N) - 1, device=device, dtype=dtype)
    run = lambda: ops.mega_attention(q, k, v, bias, chunk_size=chunk)  # noqa: E731
    return Prepared([q, k, v], run, _nbytes(q, k) + 2 * _nbytes(v))


OP_CASES = ["softmax", "linear", "xca", "mssa", "tssa", "fastmax_p1", "fastmax_p2", "csp", "cbsa"]
CAUSAL_OP_CASES = [
    "softmax",
    "softmax_explicit",
    "linear",
    "mssa",
    "tssa",
    "fastmax_p1",
    "fastmax_p2",
    "fastmax_p1_autograd",
    "fastmax_p2_autograd",
    "tssa_torch",
]
# Not in the default sweep: Fastmax with autograd through the factorisation instead of FAST §2.5's
# custom backward, to measure what that backward saves (--mechanisms fastmax_p2,fastmax_p2_autograd); TSSA
# on its PyTorch path beside the fused CPU kernels (--mechanisms tssa,tssa_torch).
# The straightforward PyTorch formulation of the same math beside attnzoo's op (bench/baselines.py), op and
# module level: --mechanisms fastmax_p1,fastmax_p1_baseline,fastmax_p2,fastmax_p2_baseline,tssa,tssa_baseline
BASELINE_CASES = list(baselines.BASELINE_CASES)
CAUSAL_OP_CASES += BASELINE_CASES
# CSP with groups of two: --mechanisms csp_pairs,csp_pairs_torch,csp_pairs_general (op level)
CSP_PAIR_CASES = ["csp_pairs", "csp_pairs_torch", "csp_pairs_general"]
# softmax with the N x N matrix materialised (the naive reference), the memory baseline of the papers' figures
EXTRA_OP_CASES = (
    ["softmax_explicit", "fastmax_p1_autograd", "fastmax_p2_autograd", "tssa_torch"] + BASELINE_CASES + CSP_PAIR_CASES
)
# MEGA's token mixing (not in the default sweep): its EMA (causal too) and its three attention forms, dense,
# chunked (r = 128) and CSP in its place; op and module level: --mechanisms ema,mega,mega_chunk,mega_csp
MEGA_CASES = ["ema", "mega", "mega_chunk", "mega_csp"]
MEGA_CHUNK = 128  # Mega-chunk's r on LRA (attnzoo.models.zoo.MEGA_CHUNK)
EXTRA_OP_CASES += MEGA_CASES
CAUSAL_OP_CASES += ["ema"]
ALL_OP_CASES = OP_CASES + EXTRA_OP_CASES


def _module_name(name: str) -> tuple[str, dict]:
    if name in ("mega", "mega_chunk", "mega_csp"):
        # the whole MEGA layer (EMA, gates, projections) with MEGA's LRA widths relative to d (E = 2d)
        return "mega", {
            "mega": {"attention": "softmax"},
            "mega_chunk": {"attention": "softmax", "chunk_size": MEGA_CHUNK},
            "mega_csp": {"attention": "csp", "csp_groups": 1, "shift_schedule": "none"},
        }[name]
    if name in EXTRA_OP_CASES and name not in BASELINE_CASES:
        raise ValueError(f"{name!r} is an op-level case only (use --level op)")
    if name in BASELINE_CASES:
        return name, {}
    if name.startswith("fastmax_p"):
        return "fastmax", {"p": int(name[-1])}
    return name, {}


def _module_case(name: str, s: Shape, causal: bool, device, dtype) -> Prepared:
    from attnzoo.layers import build_attention

    mech, opts = _module_name(name)
    if causal and mech.startswith("tssa"):
        opts["max_len"] = max(1024, s.length)
    if mech == "mega":
        opts = dict(opts, zdim=min(64, s.dim))
        if "chunk_size" not in opts and opts["attention"] != "csp":
            opts["max_len"] = max(1024, s.length)  # the relative bias spans the sequence
    if name in BASELINE_CASES:
        m = baselines.build_baseline_module(name, s.dim, s.heads, causal=causal, **opts)
    else:
        m = build_attention(mech, s.dim, s.heads, causal=causal, **opts)
    m = m.to(device=device, dtype=dtype)
    (x,) = _randn((s.batch, s.length, s.dim), device, dtype)
    params = sum(p.numel() * p.element_size() for p in m.parameters())
    return Prepared([x], lambda: m(x), 2 * _nbytes(x) + params)


def prepare(name: str, s: Shape, *, causal: bool, level: str, device, dtype) -> Prepared:
    if level == "op":
        return _op_case(name, s, causal, device, dtype)
    if level == "module":
        return _module_case(name, s, causal, device, dtype)
    raise ValueError(f"level={level!r}; valid: ['op', 'module']")


def decode_module(name: str, dim: int, heads: int, max_context: int, device, dtype):
    from attnzoo.layers import build_attention

    mech, opts = _module_name(name)
    if mech == "tssa":
        opts["max_len"] = max(1024, max_context + 1)
    return build_attention(mech, dim, heads, causal=True, **opts).to(device=device, dtype=dtype).eval()


DECODE_CASES = ["softmax", "linear", "tssa", "fastmax_p1", "fastmax_p2"]

__all__ = [
    "Shape",
    "Prepared",
    "prepare",
    "OP_CASES",
    "EXTRA_OP_CASES",
    "ALL_OP_CASES",
    "CAUSAL_OP_CASES",
    "BASELINE_CASES",
    "MEGA_CASES",
    "DECODE_CASES",
    "decode_module",
]
