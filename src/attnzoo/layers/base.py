"""Attention-module base class, the mechanism registry and the internals-capture mechanism.

Every token mixer in attnzoo is an :class:`Attention` subclass mapping ``(B, N, dim) -> (B, N, dim)``
(projections included). Each names its :class:`~attnzoo.ops._spec.Mechanism` (declared in ``ops/<op>/__init__.py``:
options, backends, causal forms, decoding state) as ``mechanism`` and registers itself with
:func:`register_attention`; users build them with :func:`build_attention` by name. The registry fills as the layer
modules are imported, which importing any ``attnzoo.layers`` module does (the package imports them all).

Internals (TSSA's Pi, attention matrices, CBSA's A_k, ...) are exposed through one mechanism: inside
``with capture_internals(model) as store:`` every attention module in ``model`` that calls
``self.record(name=tensor, ...)`` during its forward has the tensors stored (detached) under its
qualified module name: ``store["blocks.3.attn"]["pi"]``. Outside a capture, ``record`` costs nothing,
and modules can check ``self.capturing`` to skip computing expensive internals (e.g. an explicit
N x N attention map of a linear-time mechanism).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from typing import Any, Callable, Iterator

import torch
from einops import rearrange
from torch import nn

from attnzoo._checks import NonFiniteError, check_module_input, check_ndim, check_positive_int, finite_absmax
from attnzoo.ops._spec import Mechanism, Options

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

    Subclasses set ``mechanism`` (their op's spec), build their projections from ``self.options`` (the validated
    options dataclass) and call :meth:`record` for their internals.
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

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        mech = cls.__dict__.get("mechanism")
        if mech is not None:
            cls.supports_causal, cls.supports_noncausal = mech.causal, mech.noncausal
            init = cls.__dict__.get("__init__")
            if init is not None:
                # introspection (build_attention's messages, models filling in context options) sees the options
                init.__signature__ = _init_signature(mech.options)
        # NaN/Inf is found by the ops (one host sync per op call, on the projected tensors); a module re-raises it
        # naming its own input x instead of an op argument the user never saw.
        for meth in ("forward", "step"):
            fn = cls.__dict__.get(meth)
            if fn is not None and not getattr(fn, "_attnzoo_guarded", False):
                setattr(cls, meth, _name_module_input(fn, f"{cls.__qualname__}.{meth}"))

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
        self.dim = dim
        self.heads = heads
        self.head_dim = dim // heads
        self.causal = causal
        self._capture_store: dict | None = None
        self._capture_thread: int | None = None  # the thread whose capture_internals fills _capture_store

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

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, causal={self.causal}"


def _name_module_input(fn: Callable, qualname: str) -> Callable:
    def guarded(self, x, *args, **kwargs):
        try:
            return fn(self, x, *args, **kwargs)
        except NonFiniteError as e:
            if getattr(e, "module", None) is not None:  # already named by an inner module
                raise
            raise _module_error(self, x, e) from e

    # A code object of its own per method: torch.compile counts recompiles per code object, and one wrapper shared
    # by every mechanism hit its recompile limit (8) once a few modules were compiled.
    code = guarded.__code__.replace(co_name=fn.__name__, co_qualname=qualname)
    wrapped = types.FunctionType(code, guarded.__globals__, fn.__name__, guarded.__defaults__, guarded.__closure__)
    functools.update_wrapper(wrapped, fn)
    wrapped._attnzoo_guarded = True
    return wrapped


def _module_error(module: nn.Module, x, err) -> Exception:
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


_REGISTRY: dict[str, type[Attention]] = {}


def register_attention(name: str) -> Callable[[type[Attention]], type[Attention]]:
    """Class decorator: register an :class:`Attention` subclass under ``name``."""

    def deco(cls: type[Attention]) -> type[Attention]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"attention name {name!r} is already registered to {_REGISTRY[name].__name__}")
        cls.registry_name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _init_signature(options: type[Options]) -> inspect.Signature:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("dim", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int),
        inspect.Parameter("heads", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int),
        inspect.Parameter("causal", kw, default=False, annotation=bool),
    ]
    params += [
        inspect.Parameter(f.name, kw, default=f.default, annotation=f.type)
        for f in options.__dataclass_fields__.values()
    ]
    return inspect.Signature(params, return_annotation=None)


def list_attentions(causal: bool | None = None) -> list[str]:
    """Registered mechanism names; ``causal=True`` keeps those with a causal mode (read from their specs)."""
    names = sorted(_REGISTRY)
    if causal is True:
        names = [n for n in names if _REGISTRY[n].supports_causal]
    elif causal is False:
        names = [n for n in names if _REGISTRY[n].supports_noncausal]
    return names


def attention_info(name: str) -> type[Attention]:
    """The registered class of ``name`` (its ``mechanism`` attribute is the spec)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention {name!r}; valid names: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def build_attention(name: str, dim: int, heads: int, *, causal: bool = False, **options) -> Attention:
    """Build a registered token mixer ``(B, N, dim) -> (B, N, dim)``.

    Options are checked by the mechanism's options dataclass when the module is built: an unknown one raises
    ``TypeError`` listing the valid ones, a bad value ``ValueError`` naming the option, the value and what is valid.
    """
    return attention_info(name)(dim, heads, causal=causal, **options)


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


class QKVProjection:
    """The fused q/k/v projection ``qkv: Linear(dim, 3 dim)`` and output projection ``proj`` (+ dropout)
    shared by the query-key-value mechanisms (softmax, linear, Fastmax)."""

    def _init_projections(self, dim: int, qkv_bias: bool, proj_bias: bool, proj_dropout: float) -> None:
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_dropout)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(B, N, dim) -> q, k, v`` each ``(B, H, N, P)`` (views of one projection)."""
        qkv = rearrange(self.qkv(x), "b n (three h p) -> three b h n p", three=3, h=self.heads)
        return qkv[0], qkv[1], qkv[2]

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
