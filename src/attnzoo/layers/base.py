"""Attention-module base class and the internals-capture mechanism.

Every token mixer in attnzoo is an :class:`Attention` subclass mapping ``(B, N, dim) -> (B, N, dim)``
(projections included). Each names its :class:`~attnzoo.ops._spec.Mechanism` (declared in ``ops/<op>/__init__.py``:
options, backends, causal forms, decoding state) as ``mechanism`` and registers itself with
:func:`~attnzoo.registry.register_attention`; users build them with :func:`~attnzoo.registry.build_attention` by
name. The registry (:mod:`attnzoo.registry`, re-exported here where it always was) fills as the layer modules are
imported, which importing any ``attnzoo.layers`` module does (the package imports them all).

Internals (TSSA's Pi, attention matrices, CBSA's A_k, ...) are exposed through one mechanism: inside
``with capture_internals(model) as store:`` every attention module in ``model`` that calls
``self.record(name=tensor, ...)`` during its forward has the tensors stored (detached) under its
qualified module name: ``store["blocks.3.attn"]["pi"]``. Outside a capture, ``record`` costs nothing,
and modules can check ``self.capturing`` to skip computing expensive internals (e.g. an explicit
N x N attention map of a linear-time mechanism).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import types
from typing import Any, Callable, Iterator

import torch
from einops import rearrange
from torch import nn

from attnzoo._checks import NonFiniteError, check_module_input, check_ndim, check_positive_int, finite_absmax
from attnzoo.ops._segment_ops import zero_padding_tokens
from attnzoo.ops._spec import Mechanism, Options, ProjectionOptions
from attnzoo.registry import (  # noqa: F401  (re-exported: their home before attnzoo.registry)
    attention_info,
    build_attention,
    list_attentions,
    register_attention,
)

__all__ = [
    "Attention",
    "register_attention",
    "build_attention",
    "list_attentions",
    "attention_info",
    "capture_internals",
    "RecurrentMixin",
    "QKVProjection",
    "check_step_input",
    "check_kv_cache",
]


class Attention(nn.Module):
    """Base class of attnzoo token mixers: ``forward(x: (B, N, dim)) -> (B, N, dim)``.

    Subclasses set ``mechanism`` (their op's spec) and build their parameters in :meth:`build` from the validated
    ``self.options``; their constructor is made from the spec's options dataclass (one keyword-only parameter per
    field, its default), so each option is stated once, in the dataclass. They call :meth:`record` for their
    internals; their ``forward`` (and ``step``) runs inside :meth:`naming_input`. A subclass may still write its own
    ``__init__(dim, heads, *, causal=False, **options)`` calling this one.
    """

    #: the mechanism's description (options, backends, causal forms, state); ``None`` for ad-hoc mixers
    mechanism: Mechanism | None = None
    #: whether the mechanism supports a causal (autoregressive) mode at all (read from ``mechanism``)
    supports_causal: bool = False
    #: whether the non-causal mechanism may run (it is a bidirectional mixer)
    supports_noncausal: bool = True
    #: whether the module computes its own normalisation and residual update (MEGA's gated ``x + u (h - x)``): the
    #: skeleton's block then hands it the residual stream and takes back the new stream, adding no norm around it
    owns_residual: bool = False
    supports_masks: bool = False  # forward honours attention_mask= / cu_seqlens= (models refuse masks otherwise)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        mech = cls.__dict__.get("mechanism")
        if mech is not None:  # the spec states the causal forms once; the registry and the models read them here
            cls.supports_causal, cls.supports_noncausal = mech.causal, mech.noncausal
            if "__init__" not in cls.__dict__:
                cls.__init__ = _options_constructor(cls, mech.options)

    def __new__(cls, *_args: Any, **kwargs: Any) -> Attention:
        # Python's own message for a misspelt option names neither the mechanism nor the valid options
        accepted = _keywords(cls)
        unknown = [k for k in kwargs if accepted is not None and k not in accepted]
        if unknown:
            name = getattr(cls, "registry_name", cls.__name__)
            valid = cls.mechanism.options.names() if cls.mechanism is not None else sorted(accepted - {"dim", "heads"})
            raise TypeError(f"attention {name!r} got unknown option(s) {unknown}; valid options: {valid}")
        return super().__new__(cls)

    def __init__(self, dim: int, heads: int, *, causal: bool = False, **options: Any) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("heads", heads)
        if dim % heads != 0:
            raise ValueError(f"dim={dim} must be divisible by heads={heads} (valid heads divide {dim})")
        name = getattr(type(self), "registry_name", type(self).__name__)
        if causal and not self.supports_causal:
            raise ValueError(
                f"attention {name!r} has no causal mode; causal mechanisms are: {list_attentions(causal=True)}"
            )
        if not causal and not self.supports_noncausal:
            raise ValueError(f"attention {name!r} is causal-only; pass causal=True")
        mech = type(self).mechanism
        if mech is None and options:
            raise TypeError(f"attention {name!r} got unknown option(s) {list(options)}; it takes none")
        #: the validated options (``None`` for mixers without a mechanism)
        self.options: Options | None = mech.options.build(name, **options) if mech is not None else None
        why = self.options.causal_error() if causal and self.options is not None else None
        if why:  # a mechanism with a causal form may lack it for some options (MEGA with CSP)
            raise ValueError(f"attention {name!r}: {why}")
        self.dim = dim
        self.heads = heads
        self.head_dim = dim // heads
        self.causal = causal
        self._capture_store: dict | None = None
        self._capture_thread: int | None = None  # the thread whose capture_internals fills _capture_store
        if self.options is not None:
            self.build(self.options)

    def build(self, o: Options) -> None:
        """Build the layer's parameters from its validated options ``o`` (subclasses; ``dim``, ``heads``,
        ``head_dim`` and ``causal`` are set)."""

    # ---- internals -------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        # a copy (copy.deepcopy, pickle) is not part of the original's capture
        state = dict(super().__getstate__())
        state["_capture_store"] = state["_capture_thread"] = None
        return state

    @property
    def capturing(self) -> bool:
        """Whether this thread's :func:`capture_internals` is collecting this module's internals."""
        return self._capture_store is not None and self._capture_thread == threading.get_ident()

    def record(self, **tensors: torch.Tensor) -> None:
        """Store internals (detached) when a :func:`capture_internals` context of this thread is active."""
        if not self.capturing:
            return
        for k, v in tensors.items():
            self._capture_store[k] = v.detach() if isinstance(v, torch.Tensor) else v

    def check_input(self, x: torch.Tensor) -> None:
        check_ndim("x", x, 3, "(B, N, dim)")
        check_module_input(self, "x", x)
        if x.shape[-1] != self.dim:
            raise ValueError(f"x has feature size {x.shape[-1]} but this attention was built with dim={self.dim}")
        if x.shape[1] < 1:
            raise ValueError("x must hold at least one token (N >= 1)")

    def naming_input(self, x: torch.Tensor) -> _NamingInput:
        """``with self.naming_input(x):`` around a forward's body: an op's NonFiniteError (NaN/Inf or overflow found
        in the projected tensors it was given) is raised again naming this module's input ``x``, the tensor the
        user passed, instead of the op's ``q``/``k``/``v`` the user never saw.

        The ops check their tensors (one host sync per op call); the module does not read ``x`` a second time
        unless an op has failed. The ``with`` statement sits in each layer's own ``forward``: ``torch.compile``
        counts recompiles per code object, so a wrapper shared by every mechanism hits its recompile limit.
        """
        return _NamingInput(self, x)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}"


def _options_constructor(cls: type, options: type[Options]) -> Callable[..., None]:
    """``cls.__init__(dim, heads, *, causal=False, **options)`` whose signature names each field of ``options``
    (keyword-only, with the dataclass's default): what ``help``, the models and the HF swap introspect."""

    def __init__(self: Attention, dim: int, heads: int, *, causal: bool = False, **opts: Any) -> None:
        super(cls, self).__init__(dim, heads, causal=causal, **opts)

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int) for n in ("dim", "heads")),
        inspect.Parameter("causal", kw, default=False, annotation=bool),
        *(inspect.Parameter(f.name, kw, default=f.default, annotation=f.type) for f in dataclasses.fields(options)),
    ]
    __init__.__signature__ = inspect.Signature(params, return_annotation=None)
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    __init__.__doc__ = f"Build the layer; each option is a field of :class:`{options.__module__}.{options.__name__}`."
    return __init__


@functools.lru_cache(maxsize=None)
def _keywords(cls: type) -> frozenset[str] | None:
    """The keyword arguments ``cls``'s constructor takes; ``None`` where it takes ``**options`` (any)."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL) - {"self"}


class _NamingInput:
    """The context manager of :meth:`Attention.naming_input`."""

    __slots__ = ("module", "x")

    def __init__(self, module: nn.Module, x: torch.Tensor) -> None:
        self.module, self.x = module, x

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type | None, err: BaseException | None, tb: Any) -> bool:
        # an error an inner module has already named (its ``module`` is set) passes through as it is
        if typ is not None and issubclass(typ, NonFiniteError) and getattr(err, "module", None) is None:
            raise _module_error(self.module, self.x, err) from err
        return False


def _module_error(module: nn.Module, x: Any, err: NonFiniteError) -> Exception:
    """The op's NonFiniteError restated for the module: NaN/Inf in x, or a finite x that is too large."""
    name = type(module).__name__
    try:  # the error path: a second read of x costs nothing that matters now
        absmax = finite_absmax({"x": x}, op=name) if isinstance(x, torch.Tensor) else {}
    except NonFiniteError as e:
        e.module = name
        return e
    m = absmax.get("x")
    what = f"entries up to |x|={m:.3g}" if m is not None else "no NaN/Inf"
    new = NonFiniteError(
        f"{name}: the input x is finite ({what}) but inside the module {err}",
        names=("x",) + tuple(err.names),
        kind=err.kind,
    )
    new.module = name
    return new


_CAPTURE_LOCK = threading.Lock()


@contextlib.contextmanager
def capture_internals(model: nn.Module) -> Iterator[dict[str, dict[str, torch.Tensor]]]:
    """Collect the internals every :class:`Attention` in ``model`` records during forward passes.

    Yields ``{qualified_module_name: {internal_name: tensor}}``; the last forward wins. Only forwards run by the
    calling thread are recorded (another thread may use the model meanwhile); capturing the same model from two
    threads at once raises ``RuntimeError`` (capture a ``copy.deepcopy`` of it per thread). Nested captures in one
    thread record into the innermost and give the outer one back on exit.
    """
    me = threading.get_ident()
    store: dict[str, dict[str, torch.Tensor]] = {}
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, Attention)]
    with _CAPTURE_LOCK:  # check and claim together: two threads cannot both see the modules free
        busy = [n for n, m in mods if m._capture_store is not None and m._capture_thread != me]
        if busy:
            raise RuntimeError(
                f"capture_internals: {type(model).__name__} (module {busy[0] or '<root>'!r}) is being captured by "
                "another thread; capture one model per thread at a time (e.g. a copy.deepcopy of it per thread)"
            )
        previous = [(m, m._capture_store, m._capture_thread) for _, m in mods]
        for n, m in mods:
            m._capture_store, m._capture_thread = store.setdefault(n, {}), me
    try:
        yield store
    finally:
        with _CAPTURE_LOCK:
            for m, prev_store, prev_thread in previous:
                m._capture_store, m._capture_thread = prev_store, prev_thread


def _own_copy(fn: Callable, cls: type) -> Callable:
    """``fn`` with a code object of its own, as ``cls``'s method: ``torch.compile`` counts recompiles per code object,
    so one forward shared by the layers of several mechanisms would reach its recompile limit after a few of them."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__, copy.__doc__, copy.__annotations__ = fn.__kwdefaults__, fn.__doc__, fn.__annotations__
    copy.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
    return copy


#: a forward's ``attention_mask`` ``(B, N)`` and ``cu_seqlens`` ``(S + 1,)`` (``None`` where not given), by name
Masks = dict[str, torch.Tensor | None]


class QKVProjection:
    """The fused q/k/v projection ``qkv: Linear(dim, dim + 2 G P)`` and output projection ``proj`` (+ dropout)
    shared by the query-key-value mechanisms (softmax, linear, XCA, Fastmax), and their forward around
    :meth:`attend`, the mechanism on the heads. ``G = kv_heads`` key/value heads, each shared by ``H / G`` query
    heads (grouped-query attention, where the options have ``kv_heads``: linear, Fastmax); ``G = H``, the default,
    is ``Linear(dim, 3 dim)``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" not in cls.__dict__:
            cls.forward = _own_copy(QKVProjection.forward, cls)

    def _init_projections(self, o: ProjectionOptions) -> None:
        """The projections of the options ``o`` (with ``o.kv_heads`` key/value heads where the options have it)."""
        heads, kv_heads = self.heads, getattr(o, "kv_heads", None)
        if kv_heads is not None and heads % kv_heads:
            valid = [g for g in range(1, heads + 1) if heads % g == 0]
            raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}; valid: {valid} or None")
        self.kv_heads = kv_heads or heads
        self.qkv = nn.Linear(self.dim, self.dim + 2 * self.kv_heads * self.head_dim, bias=o.qkv_bias)
        self.proj = nn.Linear(self.dim, self.dim, bias=o.proj_bias)
        self.proj_drop = nn.Dropout(o.proj_dropout)

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x (B, N, dim) -> (B, N, dim)``; ``attention_mask (B, N)`` or ``cu_seqlens`` as in the op (padding
        tokens give 0)."""
        self.check_input(x)  # NaN/Inf: found by the op on q, k, v (one sync), reported for x by naming_input
        with self.naming_input(x):
            o = self.attend(*self._qkv(x), {"attention_mask": attention_mask, "cu_seqlens": cu_seqlens})
            return zero_padding_tokens(self._out(o), attention_mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks) -> torch.Tensor:
        """The mechanism on the heads: ``q, k, v (B, H, N, P) -> (B, H, N, P)`` under ``masks`` (the forward's
        ``attention_mask`` and ``cu_seqlens``, as the op takes them), recording its internals while capturing;
        grouped key/value heads come repeated per query head."""
        raise NotImplementedError  # pragma: no cover - interface

    def _qkv_grouped(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(B, N, dim) -> q (B, H, N, P)``, ``k, v (B, G, N, P)`` (views of one projection)."""
        g = getattr(self, "kv_heads", self.heads)
        if g == self.heads:
            qkv = rearrange(self.qkv(x), "b n (three h p) -> three b h n p", three=3, h=self.heads)
            return qkv[0], qkv[1], qkv[2]
        q, k, v = self.qkv(x).split([self.dim, g * self.head_dim, g * self.head_dim], dim=-1)
        return (
            rearrange(q, "b n (h p) -> b h n p", h=self.heads),
            rearrange(k, "b n (g p) -> b g n p", g=g),
            rearrange(v, "b n (g p) -> b g n p", g=g),
        )

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(B, N, dim) -> q, k, v`` each ``(B, H, N, P)``: grouped key/value heads repeated per query head."""
        q, k, v = self._qkv_grouped(x)
        return (q, *self._repeat_kv(k, v))

    def _repeat_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Grouped key/value heads ``(B, G, N, P)`` repeated per query head: ``(B, H, N, P)`` (as given if G = H)."""
        rep = self.heads // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return k, v

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        """``(B, H, N, P) -> (B, N, dim)``: merge the heads, project, dropout."""
        return self.proj_drop(self.proj(rearrange(o, "b h n p -> b n (h p)")))


class RecurrentMixin:
    """Token-by-token decoding for causal mechanisms (recurrent state or KV cache).

    ``state = m.init_state(batch_size, device=..., dtype=...)`` then repeatedly
    ``y, state = m.step(x_t, state)`` with ``x_t`` of shape ``(B, 1, dim)``; the outputs equal the
    causal parallel forward at the same positions. Linear mechanisms keep O(1) state per step.
    """

    supports_step: bool = True

    def init_state(self, batch_size: int, *, device=None, dtype=None):  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, x: torch.Tensor, state):  # pragma: no cover - interface
        raise NotImplementedError


def check_step_input(module: Attention, x: torch.Tensor) -> None:
    """``step`` takes one token ``(B, 1, dim)`` of a causal module."""
    if not module.causal:
        raise ValueError(f"{type(module).__name__}.step decodes causally; build the module with causal=True")
    module.check_input(x)
    if x.shape[1] != 1:
        raise ValueError(f"step takes one token at a time: x must have shape (B, 1, dim), got {tuple(x.shape)}")


def check_kv_cache(state, batch: int, names: tuple[str, ...]) -> None:
    """``state`` is a cache dict with keys ``names`` built for ``batch`` sequences."""
    if not isinstance(state, dict) or any(n not in state for n in names):
        raise TypeError(f"state must be the dict returned by init_state/step with keys {list(names)}")
    if state[names[0]].shape[0] != batch:
        raise ValueError(f"state was built for batch size {state[names[0]].shape[0]}, but x has batch size {batch}")
