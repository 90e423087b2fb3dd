"""The ``varlen`` sweep of ``attnzoo bench``: padded and packed calls against the unmasked call over the
same real tokens.

A batch of ``B`` sequences on a grid of ``N`` tokens: the first ``ceil(B/2)`` rows are full, the other rows hold
shorter sequences of distinct odd lengths (:func:`varlen_lengths`), padded alternately on the right and on the left.
Three calls of the op see exactly these ``T = sum of lengths`` real tokens:

- ``dense``: the unmasked op on one row of ``T`` tokens, ``(1, H, T, P)``, no mask;
- ``masked``: the op on the padded batch ``(B, H, N, P)`` with ``attention_mask``;
- ``packed``: the op on the sequences packed in one row ``(1, H, T, P)`` with ``cu_seqlens``.

Why ``dense`` is the reference: the mechanisms measured here cost O(tokens) per call, so one unmasked row of ``T``
tokens does the same arithmetic an ideal varlen implementation does (every real token once, no padding, no
boundaries), in a single call without per-call overheads; it is what a user gets by ignoring the sequence
boundaries, i.e. the speed the masks should cost nothing against. Running each sequence alone and summing would
add one Python call per sequence to the reference, which flatters the masked paths. The padded call still holds
``B * N - T`` padding tokens, so a path that computes on padding and zeroes it afterwards pays ``B N / T`` on top.

Timing: the three calls alternate within one process (``dense, masked, packed`` per round, after a warm-up of
each), so that load from other processes falls on all three alike; the figure of merit is the median over rounds
of each round's ratio ``masked / dense`` and ``packed / dense``. The machine's load average is recorded beside
the results (the shared CI/VM machines run other jobs).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch

from attnzoo.bench.cases import Prepared, Shape, registered_cases
from attnzoo.bench.runner import _settle_heap

__all__ = ["VarlenRow", "varlen_lengths", "varlen_forms", "measure_varlen", "VARLEN_TARGET", "varlen_cases"]

#: the most a masked or packed call may cost over the dense call on the same real tokens (masked/dense, packed/dense)
VARLEN_TARGET = 1.2


def varlen_cases() -> list[str]:
    """The op cases that declare a varlen form (``BenchCase(varlen=True)``)."""
    return [n for n, (_, c) in registered_cases().items() if c.varlen]


def case_backends(name: str) -> list[str]:
    """The backend names of bench case ``name``'s mechanism."""
    from attnzoo.layers import attention_info

    return list(attention_info(registered_cases()[name][0]).mechanism.backends)


def varlen_lengths(batch: int, length: int) -> list[int]:
    """The lengths of the batch: ``ceil(B/2)`` full rows of ``N``, then ``floor(B/2)`` distinct odd lengths spread
    evenly over ``(N/2, N)``."""
    if batch < 1 or length < 4:
        raise ValueError(f"the varlen sweep needs batch >= 1 and length >= 4, got batch={batch}, length={length}")
    m = batch // 2
    short = [(length - (j + 1) * length // (2 * m + 2)) | 1 for j in range(m)]
    return [length] * (batch - m) + [min(x, length - 1) for x in short]


def varlen_forms(
    name: str, heads: int, dim: int, lengths: list[int], length: int, *, causal: bool, device, dtype
) -> dict[str, Prepared]:
    """The ``dense``, ``masked`` and ``packed`` calls of case ``name`` (module doc) over sequences of ``lengths``
    on a grid of ``length`` tokens."""
    _, case = registered_cases()[name]
    if not case.varlen:
        raise ValueError(f"bench case {name!r} has no varlen form; cases with one: {varlen_cases()}")
    batch, total = len(lengths), sum(lengths)
    mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    for b, n in enumerate(lengths):
        if b % 2 == 0:
            mask[b, :n] = True
        else:  # left padding
            mask[b, length - n :] = True
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    one = Shape(1, heads, total, dim)
    forms = {
        "dense": case.prepare(one, causal, device, dtype),
        "masked": case.prepare(Shape(batch, heads, length, dim), causal, device, dtype, attention_mask=mask),
        "packed": case.prepare(one, causal, device, dtype, cu_seqlens=cu),
    }
    return {k: Prepared(*v) for k, v in forms.items()}


@dataclass
class VarlenRow:
    mechanism: str
    causal: bool
    mode: str  # "fwd" or "fwd+bwd"
    batch: int
    heads: int
    length: int
    dim: int
    real_tokens: int
    dense_ms: float
    masked_ms: float
    packed_ms: float
    masked_ratio: float  # median over rounds of masked / dense
    packed_ratio: float
    rounds: int
    backend: str = "auto"  # what "auto" was made to mean for every form (force_backend), or "auto"


def _timed(fn, cuda: bool = False) -> float:
    # on CUDA the call only queues kernels: synchronise on both sides so that the interval holds its GPU work (the
    # launch overhead is in every form's time alike)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure_varlen(
    name: str,
    *,
    batch: int,
    heads: int,
    length: int,
    dim: int,
    causal: bool,
    backward: bool,
    device,
    dtype,
    repeats: int,
    backend: str | None = None,
) -> list[VarlenRow]:
    """The ``fwd`` (and ``fwd+bwd``) row of case ``name``: the three forms timed alternately, ``repeats`` rounds.
    ``backend``: every form's ``"auto"`` resolves to it where the op has it (:func:`force_backend`), e.g.
    ``"triton"`` to time the masked Triton kernels, which ``"auto"`` does not take for masked calls."""
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"the varlen sweep times CPU or CUDA calls; got device={device}")
    if backend is None or backend not in case_backends(name):  # the op has no such backend: "auto" it is
        return _measure(name, batch, heads, length, dim, causal, backward, device, dtype, repeats, kind)
    from attnzoo.ops._dispatch import force_backend

    with force_backend(backend):
        rows = _measure(name, batch, heads, length, dim, causal, backward, device, dtype, repeats, kind)
    for r in rows:
        r.backend = backend
    return rows


def _measure(name, batch, heads, length, dim, causal, backward, device, dtype, repeats, kind) -> list[VarlenRow]:
    lengths = varlen_lengths(batch, length)
    forms = varlen_forms(name, heads, dim, lengths, length, causal=causal, device=device, dtype=dtype)
    rows = []
    for mode in ("fwd", "fwd+bwd") if backward else ("fwd",):
        calls = {}
        for key, f in forms.items():
            call = f.forward() if mode == "fwd" else f.forward_backward()
            call()
            if kind == "cpu":
                _settle_heap(call)
            calls[key] = call
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(repeats):
            for key, call in calls.items():
                times[key].append(_timed(call, cuda=kind == "cuda"))
        ratio = {k: statistics.median(a / d for a, d in zip(times[k], times["dense"], strict=True)) for k in calls}
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append(
            VarlenRow(
                name,
                causal,
                mode,
                batch,
                heads,
                length,
                dim,
                sum(lengths),
                med["dense"],
                med["masked"],
                med["packed"],
                ratio["masked"],
                ratio["packed"],
                repeats,
            )
        )
    return rows


def load_average() -> tuple[float, float, float] | None:
    """The machine's 1/5/15-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def print_varlen(rows: list[VarlenRow]) -> None:
    hdr = (
        f"{'mechanism':<20}{'causal':<7}{'mode':<9}{'B':>3}{'N':>6}{'T':>7}{'dense ms':>10}{'masked ms':>11}"
        f"{'packed ms':>11}{'masked/x':>10}{'packed/x':>10}"
    )
    print(hdr)
    print("-" * len(hdr))

    def label(r: VarlenRow) -> str:
        return r.mechanism + ("" if r.backend == "auto" else "/" + r.backend)

    for r in rows:
        flag = lambda x: "" if x <= VARLEN_TARGET else " !"  # noqa: E731
        print(
            f"{label(r):<20}{str(r.causal):<7}{r.mode:<9}{r.batch:>3}{r.length:>6}{r.real_tokens:>7}"
            f"{r.dense_ms:>10.1f}{r.masked_ms:>11.1f}{r.packed_ms:>11.1f}{r.masked_ratio:>8.2f}{flag(r.masked_ratio):<2}"
            f"{r.packed_ratio:>8.2f}{flag(r.packed_ratio):<2}"
        )
