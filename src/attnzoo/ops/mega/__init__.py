"""MEGA (Ma et al. 2022): the single-head gated attention of the MEGA layer and the layer's spec.

:func:`mega_attention` is the attention of MEGA §3.2-3.3 on already-projected tensors: ``q, k (B, N, Z)`` (the
shared ``Z`` with its two offsets), ``v (B, N, E)`` and the relative position bias, with ``softmax`` (text) or
the Laplace function (§3.3, images), over the whole sequence or within chunks of ``chunk_size`` tokens (§3.5,
"Mega-chunk"). Backends: ``"naive"`` (the explicit ``(N, N)`` map with a chunk mask, :mod:`.naive`) and
``"torch"`` (chunk by chunk, :mod:`.chunked`). MEGA is single-head: the layout has no ``H``.

:data:`MEGA` declares the layer (:class:`attnzoo.layers.mega.MegaLayer`): its EMA (:mod:`attnzoo.ops.ema`), its
attention (``"softmax"``, ``"laplace"`` or ``"csp"``: CSP eq 4 in place of the attention, CSP §4 / Table 7) and
its gates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnzoo._checks import (
    check_bool,
    check_choice,
    check_ndim,
    check_optional_positive_int,
    check_positive_int,
    check_probability,
    finite_absmax,
)
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._spec import BenchCase, Card, Mechanism, Options, op_backends, option
from attnzoo.ops._varlen import segments
from attnzoo.ops.csp.shifts import SHIFT_SCHEDULES
from attnzoo.ops.mega.chunk import mega_attention_chunked
from attnzoo.ops.mega.naive import mega_attention_naive

__all__ = ["mega_attention", "MegaOptions", "MEGA", "ATTENTIONS", "NORM_LAYERS", "INITS"]

#: the attention of the MEGA layer: MEGA's two functions, or CSP in its place
ATTENTIONS = ("softmax", "laplace", "csp")
#: MEGA's normalisations (``--norm-type`` of its code): LayerNorm, ScaleNorm, BatchNorm over tokens
NORM_LAYERS = ("layernorm", "scalenorm", "batchnorm")  # the names attnzoo.layers._norms.build_norm takes
#: the layer's initialisations (:meth:`attnzoo.layers.mega.MegaLayer.reset_parameters`)
INITS = ("scaled", "mega")


def _choice(choices):
    def check(name, value):
        check_choice(name, value, choices)
        return value

    return check


def _check_layer_index(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class MegaOptions(Options):
    """Options of the MEGA layer (MEGA §3, the code's ``MovingAverageGatedAttention``)."""

    attention: str = option("softmax", _choice(ATTENTIONS), "'softmax' (text), 'laplace' (images) or 'csp' (CSP eq 4)")
    ndim: int = option(16, check_positive_int, "h: expanded dimensions of the EMA per channel (MEGA §3.1)")
    zdim: int = option(64, check_positive_int, "Z: width of the shared query/key representation (MEGA §3.2)")
    hdim: int | None = option(None, check_optional_positive_int, "E: width of the value and gates (None: 2 dim)")
    chunk_size: int | None = option(None, check_optional_positive_int, "r of MEGA-chunk (§3.5); None: one chunk")
    max_len: int = option(1024, check_positive_int, "positions of the relative bias without chunks (2 max_len - 1)")
    norm_layer: str = option("layernorm", _choice(NORM_LAYERS), "the layer's normalisation (MEGA's --norm-type)")
    prenorm: bool = option(True, check_bool, "normalise the input (True) or the output (False) of the layer")
    dropout: float = option(0.0, check_probability, "dropout on the EMA output and the layer output")
    hidden_dropout: float = option(0.0, check_probability, "dropout on the value")
    csp_groups: int | None = option(1, check_optional_positive_int, "CSP's K (eq 4); None: shifting only (K = N)")
    shift_schedule: str = option("linear", _choice(SHIFT_SCHEDULES), "CSP's shifts: 'linear', 'power' or 'none'")
    layer_index: int = option(0, _check_layer_index, "this layer's place in CSP's power-law schedule")
    num_layers: int = option(1, check_positive_int, "layers of CSP's schedule")
    init: str = option(
        "scaled",
        _choice(INITS),
        "'scaled': projections N(0, 1/fan_in), kappa_q/k N(0, 1), so the attention path gets gradients from step 1; "
        "'mega': MEGA's code, projections and kappa N(0, 0.02) (its attention starts dead: needs long training)",
    )

    def causal_error(self) -> str | None:
        if self.attention == "csp":
            return (
                "MEGA with attention='csp' has no causal form (CSP's shifts and groups mix every token of a group, "
                "later ones included); for a causal MEGA use attention='softmax' or 'laplace' (with chunk_size for "
                "MEGA-chunk), or build it with causal=False"
            )
        if self.norm_layer == "batchnorm":
            return (
                "MEGA with norm_layer='batchnorm' has no causal form: BatchNorm pools statistics over every token of "
                "the batch in training, later tokens included; use norm_layer='layernorm' or 'scalenorm' for a "
                "causal MEGA"
            )
        return None

    def label(self) -> str:
        """The attention MEGA's layer runs (softmax, laplace, or CSP in its place)."""
        return self.attention

    def validate(self) -> None:
        if self.layer_index >= self.num_layers:
            raise ValueError(
                f"layer_index must be an integer in [0, num_layers={self.num_layers}), got {self.layer_index!r}"
            )
        if self.attention == "csp" and self.chunk_size is not None:
            raise ValueError(
                f"chunk_size={self.chunk_size} chunks MEGA's attention; with attention='csp' CSP's groups "
                "(csp_groups) play that part: leave chunk_size=None"
            )


MEGA = Mechanism(
    op="mega_attention",
    options=MegaOptions,
    backends=op_backends(mega_attention_naive, mega_attention_chunked),
    mask_options=("toks",),
    causal=True,  # MEGA's decoders: causal EMA and causal attention (within chunks); CSP has no causal form
    state=dict,  # MegaLayer.init_state: EMA state, key/value cache of the current chunk, positions
    examples=(
        {"attention": "laplace", "chunk_size": 4, "ndim": 3, "zdim": 5, "hdim": 7, "max_len": 9},
        {"attention": "softmax", "chunk_size": 4, "norm_layer": "scalenorm", "prenorm": False, "max_len": 9},
        {"attention": "csp", "csp_groups": 3, "shift_schedule": "power", "layer_index": 1, "num_layers": 2},
        {"attention": "csp", "csp_groups": None, "norm_layer": "batchnorm"},
    ),
    checks="attnzoo.ops.mega.selftest_cases",
    bench=(
        BenchCase("ema", "attnzoo.ops.mega.bench:ema", default=False, causal=True),
        BenchCase(
            "mega",
            "attnzoo.ops.mega.bench:mega",
            default=False,
            module={"attention": "softmax"},
            sized="attnzoo.ops.mega.bench:sized",
        ),
        BenchCase(
            "mega_chunk",
            "attnzoo.ops.mega.bench:mega_chunk",
            default=False,
            module={"attention": "softmax", "chunk_size": 128},
            sized="attnzoo.ops.mega.bench:sized",
        ),
        BenchCase(
            "mega_csp",
            "attnzoo.ops.mega.bench:mega_csp",
            default=False,
            module={"attention": "csp", "csp_groups": 1, "shift_schedule": "none"},
            sized="attnzoo.ops.mega.bench:sized",
        ),
    ),
    card=Card(
        "MEGA layer (Ma et al. 2022): damped EMA + single-head gated attention (softmax / Laplace), chunks of r, "
        "or CSP in its place",
        "O(N²), O(N·r) chunked, O(N log N) with CSP; EMA O(N log N) (FFT), causal O(N·L) (blocks of L = 64)",
        "O(N²), O(N·r), O(N)",
        causal="causal EMA + causal attention (within chunks), recurrent step; not with CSP",
        ops=("ema", "mega_attention"),
    ),
    order=8,
)


def mega_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    *,
    fn: str = "softmax",
    chunk_size: int | None = None,
    causal: bool = False,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """MEGA's single-head attention (§3.2-3.3; §3.5 chunks): ``q, k (B, N, Z)``, ``v (B, N, E)`` -> ``(B, N, E)``.

    ``rel_bias (2R - 1,)``: ``rel_bias[R - 1 + j - i]`` is added to the score of query i and key j; R must cover
    the attention's span (N, or ``chunk_size``). ``fn``: ``"softmax"`` (scores scaled by ``Z^-1/2``) or
    ``"laplace"`` (scores divided by the keys of the chunk). ``chunk_size``: attention within consecutive chunks of
    that many tokens (the last may be shorter); ``None`` or ``>= N`` is full attention. ``causal``: query i reads
    keys ``j <= i`` of its chunk only (MEGA's decoders; the Laplace scale is then ``i + 1`` within the chunk).

    ``attention_mask`` ``(B, N)`` (True at real tokens) or ``cu_seqlens`` ``(S + 1,)`` (sequences packed in one
    row): each sequence attends within itself, its chunks counted from its first token and the bias read at
    positions within it (:mod:`attnzoo.ops.mega.varlen`); R must then cover the longest sequence's span. Padding
    gives zeros. Both backends take them.
    """
    check_choice("fn", fn, ("softmax", "laplace"))
    causal = check_bool("causal", causal)
    chunk_size = check_optional_positive_int("chunk_size", chunk_size)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_ndim(name, t, 3, "(B, N, Z)" if name != "v" else "(B, N, E)")
    check_ndim("rel_bias", rel_bias, 1, "(2R - 1,)")
    if q.shape != k.shape:
        raise ValueError(f"q and k must share one shape (B, N, Z), got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:2] != q.shape[:2]:
        raise ValueError(f"v must have q's (B, N) = {tuple(q.shape[:2])}, got {tuple(v.shape)}")
    if any(t.dtype != q.dtype or t.device != q.device for t in (k, v, rel_bias)):
        raise TypeError("q, k, v and rel_bias must share one dtype and device")
    N = q.shape[1]
    if N < 1 or q.shape[2] < 1 or v.shape[2] < 1:
        raise ValueError(f"q and v need one token and one channel at least, got {tuple(q.shape)}, {tuple(v.shape)}")
    toks = segments(q.shape[0], N, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    longest = N if toks is None else max(1, int(toks.lengths.max()))
    span = longest if chunk_size is None else min(chunk_size, longest)
    if rel_bias.shape[0] % 2 == 0 or (rel_bias.shape[0] + 1) // 2 < span:
        raise ValueError(
            f"rel_bias must hold 2R - 1 values with R >= {span} (the attention's span: "
            f"{'N' if span == longest else 'chunk_size'}), got {rel_bias.shape[0]}"
        )
    finite_absmax({"q": q, "k": k, "v": v, "rel_bias": rel_bias}, op="mega_attention")
    if toks is not None:
        opts = dict(fn=fn, chunk=span, toks=toks, chunk_size=chunk_size, causal=causal)
        return call_backend(MEGA, backend, (q, k, v, rel_bias), name="q", **opts)
    return call_backend(MEGA, backend, (q, k, v, rel_bias), name="q", fn=fn, chunk=span, causal=causal)
