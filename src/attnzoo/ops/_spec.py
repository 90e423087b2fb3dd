"""The description of a mechanism, declared once in its ``ops/<op>/__init__.py``.

A :class:`Mechanism` says what a mechanism is to the rest of attnzoo: its typed options (an :class:`Options`
dataclass whose fields are checked by the shared checks of :mod:`attnzoo._checks`), the backends of its op (name ->
:class:`Backend`, each with the devices it runs on), whether it has a causal and a bidirectional form, and the type
of its recurrent decoding state. The op dispatches through it (:mod:`attnzoo.ops._dispatch`), its layer builds its
options from it, and ``build_attention`` / ``list_attentions`` / ``attention_info`` read it. What the rest of attnzoo
needs of the mechanism is declared here too, read through the attention registry so that a mechanism registered at
runtime is served like the built-in ones: its layer's :class:`Projections` (``swap_attention``, capture), its
:class:`BenchCase` list (``attnzoo bench``) and its :class:`Card` (the README mechanisms table).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

from attnzoo._checks import check_bool, check_optional_positive_int, check_probability

__all__ = [
    "Backend",
    "BenchCase",
    "Card",
    "CheckCase",
    "GroupedProjectionOptions",
    "Mechanism",
    "Options",
    "Projections",
    "ProjectionOptions",
    "Shape",
    "op_backends",
    "option",
    "triton_available",
]


@functools.lru_cache(maxsize=None)
def triton_available(module: str) -> bool:
    """Whether the ``triton`` package and the kernel module ``module`` can be imported (no import happens; the
    answer is kept for the process, as the installed packages do not change under it)."""
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class Backend:
    """One implementation of an op: ``fn`` called with the op's tensors and options.

    ``fn`` is the function itself (go-to-definition leads from the mechanism to it). Only a kernel whose import is
    optional is named instead, ``Backend("module", "attr")``, and imported when it first runs. ``kind`` is what
    ``"auto"`` selects by: ``"reference"`` (the ``naive.py`` of the op), ``"torch"`` (the PyTorch path), ``"cpu"``
    (fused C++ kernels for CPU tensors), ``"triton"``. ``available`` (when given) says whether the backend can run
    in this process at all.

    Calling convention (:func:`attnzoo.ops._dispatch.call_backend`): ``fn(*inputs, **options)``, the op's tensor
    arguments in its order (``None`` for an absent optional one) and its checked keyword options, the same for
    every backend of the op; each backend prepares them itself (standardisation, dtype, layout, value checks).
    """

    #: the function, or the name of the module of an optional kernel (then ``attr`` names the function in it)
    fn: Callable | str
    #: the function's name (from ``fn`` when ``fn`` is the function)
    attr: str | None = None
    kind: str = "torch"
    #: device types it runs on ("any": every one): ``attnzoo selftest`` runs it there; "cpu" kernels refuse others.
    #: Left empty, the kind's: ``("cpu",)`` for ``"cpu"`` kernels, ``("cuda",)`` for ``"triton"``, else ``("any",)``
    devices: tuple[str, ...] = ()
    available: Callable[[], bool] | None = None
    #: the kernel module it imports when it runs, if not ``module`` (a Triton backend also needs ``triton``)
    needs: str | None = None
    #: for ``"auto"``: whether it takes a call, given ``(inputs, options)``; ``None``: every call (CPU and Triton
    #: kernels), or never for a ``"torch"`` backend other than the default (with a rule, ``"auto"`` takes it over
    #: the default where the rule holds and no kernel took the call)
    auto_if: Callable[[tuple, Mapping[str, Any]], bool] | None = None
    #: whether it takes ``attention_mask`` / ``cu_seqlens`` (padded batches, packed rows); the dispatcher refuses a
    #: masked call to one that does not, and ``"auto"`` never picks it for one
    masks: bool = True
    #: whether ``"auto"`` may pick it for a masked call (False: only when named, e.g. kernels whose masked paths are
    #: not yet verified on their device)
    auto_masks: bool = True

    KIND_DEVICES: ClassVar[Mapping[str, tuple[str, ...]]] = {"cpu": ("cpu",), "triton": ("cuda",)}

    def __post_init__(self) -> None:
        if not self.devices:
            object.__setattr__(self, "devices", self.KIND_DEVICES.get(self.kind, ("any",)))
        if isinstance(self.fn, str):
            if not self.attr:
                raise ValueError(
                    f"Backend({self.fn!r}) names a module: give the function's name too, Backend({self.fn!r}, "
                    "'function'), or pass the function itself"
                )
        elif callable(self.fn):
            if self.attr is None:  # a given one stays: the name in messages of a function replaced by a test
                object.__setattr__(self, "attr", getattr(self.fn, "__name__", type(self.fn).__name__))
        else:
            raise TypeError(f"Backend takes a function or a module name, got {type(self.fn).__name__} {self.fn!r}")

    @property
    def module(self) -> str:
        """The module of the function (for messages, and what a Triton backend without ``needs`` imports)."""
        return self.fn if isinstance(self.fn, str) else self.fn.__module__

    def is_available(self) -> bool:
        if self.available is not None:
            return self.available()
        if self.kind == "triton":
            return triton_available(self.needs or self.module)
        return True

    def load(self) -> Callable:
        if not isinstance(self.fn, str):
            return self.fn
        # sys.modules first: torch.compile traces a dict lookup, not the import machinery
        mod = sys.modules.get(self.fn)
        if mod is None:
            mod = importlib.import_module(self.fn)
        return getattr(mod, self.attr)


def op_backends(reference: Callable, torch_path: Callable, **others: Backend) -> dict[str, Backend]:
    """An op's backends: ``"naive"``, its literal reference (the ``naive.py`` of the paper's equations, what every
    other backend is tested against), ``"torch"``, its PyTorch path (what ``"auto"`` runs when no kernel takes the
    call), then its other forms by name (kernels, other PyTorch forms)."""
    return {"naive": Backend(reference, kind="reference"), "torch": Backend(torch_path), **others}


def option(default: Any, check: Callable[[str, Any], Any] | None = None, doc: str = "") -> Any:
    """A field of an :class:`Options` dataclass: ``check(name, value)`` validates it and returns the stored value."""
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass(frozen=True)
class Options:
    """Base of the options dataclasses: every field's check runs at construction, then :meth:`validate`.

    A bad value raises at construction (building the layer or the model), naming the option, the value and what
    is valid: never at the first forward.
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None:
                value = check(f.name, getattr(self, f.name))
                if value is not None:
                    object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self) -> None:
        """Checks across fields (subclasses)."""

    def causal_error(self) -> str | None:
        """Why these options have no causal form, or ``None`` (subclasses): the layer refuses ``causal=True`` with
        this message, and the contract tests run such option sets in the bidirectional form only."""
        return None

    def label(self) -> str | None:
        """What these options make of the mechanism, for listings such as ``attnzoo models`` (e.g. the attention a
        layer runs inside it), or ``None`` (subclasses)."""
        return None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def check(cls, name: str, value: Any) -> Any:
        """Check one option as the dataclass would (for the ops, which take options as keywords)."""
        f = cls.__dataclass_fields__[name]
        check = f.metadata.get("check")
        if check is None:
            return value
        out = check(name, value)
        return value if out is None else out

    @classmethod
    def build(cls, mechanism: str, **options: Any) -> "Options":
        """``cls(**options)``; an unknown name raises ``TypeError`` listing the valid ones."""
        valid = cls.names()
        unknown = [k for k in options if k not in valid]
        if unknown:
            raise TypeError(f"attention {mechanism!r} got unknown option(s) {unknown}; valid options: {valid}")
        return cls(**options)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class ProjectionOptions(Options):
    """The options of the fused q/k/v and output projections (:class:`attnzoo.layers.base.QKVProjection`), the
    base of the options of the layers that have them."""

    qkv_bias: bool = option(True, check_bool, "bias of the fused q/k/v projection")
    proj_bias: bool = option(True, check_bool, "bias of the output projection")
    proj_dropout: float = option(0.0, check_probability, "dropout after the output projection")


@dataclass(frozen=True)
class GroupedProjectionOptions(ProjectionOptions):
    """:class:`ProjectionOptions` with grouped key/value heads (grouped-query attention): ``qkv: Linear(dim,
    dim + 2 G P)`` for ``G = kv_heads`` key/value heads of head size ``P``. The layer checks that ``G`` divides its
    heads (the options do not know them)."""

    kv_heads: int | None = option(
        None,
        check_optional_positive_int,
        "key/value heads G, each shared by heads / G query heads (grouped-query attention; the decoding state is "
        "kept per group); None: one per query head",
    )


@dataclass(frozen=True)
class Projections:
    """The ``nn.Linear`` projections of a mechanism's layer, by attribute name (``None``: the layer has none).

    ``swap_attention`` copies a pretrained attention's weights by these names and capture reads the subspace
    bases from ``shared``; a layer that declares none of them is refused by the swap rather than left with fresh
    projections under a pretrained model's rotary embedding.
    """

    #: fused ``(q | k | v)`` projection ``Linear(dim, 3 dim)`` of standard attention
    qkv: str | None = None
    q: str | None = None
    k: str | None = None
    v: str | None = None
    #: one projection ``U`` serving as query, key and value (the subspace bases of TSSA, MSSA, CBSA)
    shared: str | None = None
    out: str | None = None
    #: the layer's options a swap sets from the attention it replaces, where the caller leaves them: of
    #: ``qkv_bias`` (the q/k/v bias), ``v_bias``, ``proj_bias`` (the output bias), ``scale`` (the attention
    #: logits' scale, only where it means the same), ``attn_dropout``, ``proj_dropout``
    follows: tuple[str, ...] = ("proj_bias", "attn_dropout", "proj_dropout")
    FOLLOWABLE: ClassVar[tuple[str, ...]] = ("qkv_bias", "v_bias", "proj_bias", "scale", "attn_dropout", "proj_dropout")

    def __post_init__(self) -> None:
        bad = [n for n in self.follows if n not in self.FOLLOWABLE]
        if bad:
            raise ValueError(f"Projections.follows has {bad}; valid: {list(self.FOLLOWABLE)}")

    def copied(self) -> dict[str, str]:
        """Role (``"qkv"``, ``"q"``, ``"k"``, ``"v"``, ``"o"``) -> attribute of the projections a swap copies into."""
        roles = {"qkv": self.qkv, "q": self.q, "k": self.k, "v": self.v, "o": self.out}
        return {role: attr for role, attr in roles.items() if attr is not None}


@dataclass(frozen=True)
class Shape:
    """A benchmark shape: ``batch`` x ``heads`` x ``length`` tokens of model width ``dim`` (``heads * head_dim``)."""

    batch: int
    heads: int
    length: int
    dim: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass(frozen=True)
class BenchCase:
    """One case of ``attnzoo bench``, declared by the mechanism it measures.

    ``op`` names (``"module:function"``, imported when the case runs) ``fn(shape, causal, device, dtype) ->
    (inputs, run, bytes_moved)``: the tensors that receive gradients, the timed call, and the bytes an ideal
    implementation moves (the roofline reference).
    """

    name: str
    op: str
    #: in the default sweep (otherwise run only when named with ``--mechanisms``)
    default: bool = True
    #: the n sweep also runs its causal form
    causal: bool = False
    #: options of the mechanism's layer for ``--level module``; ``None``: an op-level case only
    module: Mapping[str, Any] | None = None
    #: ``"module:function"`` of ``fn(options, length, dim, causal) -> options``: the layer's options that depend on
    #: the shape (a position table as long as the sequence)
    sized: str | None = None
    #: the decode sweep times its causal layer's ``step``
    decode: bool = False
    #: the varlen sweep (:mod:`attnzoo.bench.varlen`) calls ``op`` with ``attention_mask=`` / ``cu_seqlens=``
    varlen: bool = False
    #: a straightforward PyTorch transcription of the mechanism's paper (no attnzoo machinery), timed beside the op
    baseline: bool = False
    #: ``"module:function"`` of ``fn(dim, heads, *, causal, max_len) -> nn.Module``: the module ``--level module``
    #: times instead of the mechanism's layer (a baseline's own module)
    builder: str | None = None
    #: the case the table's speed column divides by (the SDPA softmax baseline, ``x SDPA``)
    speed_unit: bool = False

    def prepare(
        self, shape: Shape, causal: bool, device: Any, dtype: Any, **mask: Any
    ) -> tuple[list, Callable[[], Any], int]:
        """``(inputs, run, bytes_moved)`` of the op-level case at ``shape`` (``mask``: the varlen keywords)."""
        return _load(self.op)(shape, causal, device, dtype, **mask)

    def build_module(self, dim: int, heads: int, *, causal: bool, max_len: int) -> Any:
        """The module of :attr:`builder` (a baseline's own module)."""
        return _load(self.builder)(dim, heads, causal=causal, max_len=max_len)

    def module_options(self, length: int, dim: int, causal: bool) -> dict[str, Any]:
        """The layer's options for a sequence of ``length`` tokens of width ``dim``."""
        opts = dict(self.module or {})
        return _load(self.sized)(opts, length, dim, causal) if self.sized else opts


def _load(ref: str) -> Callable:
    """The function ``"module:function"`` names (its module imported on first use)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Card:
    """The mechanism's row of the README mechanisms table (generated by ``scripts/models_table.py``)."""

    paper: str
    #: time and memory in the sequence length N
    time: str
    memory: str
    #: what the causal form is (or why there is none), after ``yes`` / ``no``
    causal: str = ""
    #: the ``attnzoo.ops`` functions of the layer (default: the mechanism's ``op``)
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mechanism:
    """A mechanism's one description: options, backends, causal forms and decoding state."""

    #: name of the op in messages and in the Triton fallback bookkeeping (e.g. ``"softmax_attention"``)
    op: str
    options: type[Options]
    backends: Mapping[str, Backend]
    #: whether the op has a causal (autoregressive) form
    causal: bool
    #: whether the bidirectional form may run
    noncausal: bool = True
    #: type of the decoding state of the layer's ``init_state``/``step`` (``None``: no recurrent form)
    state: Any = None
    #: what ``"auto"`` runs when no Triton or CPU kernel applies, and what a failing Triton kernel falls back to
    default: str = "torch"
    #: the literal reference implementation (``naive.py``) the tests compare with
    reference: str = "naive"
    #: option sets the contract tests (tests/contract/test_contract_layers.py) run besides the defaults, for a
    #: sequence of 9 tokens: the options that change the computation (orders, variants, chunking)
    examples: tuple[dict[str, Any], ...] = ()
    #: module whose ``CASES`` (:class:`CheckCase`) say how ``attnzoo selftest`` exercises the op (``None``: no case)
    checks: str | None = None
    #: the layer's projections (``swap_attention``, capture); ``None``: not declared, the layer is not swappable
    projections: Projections | None = None
    #: its ``attnzoo bench`` cases
    bench: tuple[BenchCase, ...] = ()
    #: its README row; ``None``: a row with its name only
    card: Card | None = None
    #: position in listings (the README table, the bench's default sweep): the softmax baseline first
    order: int = 1000
    #: the keyword options under which the op hands its backends a call's padding mask or packed offsets (or the
    #: :class:`~attnzoo.ops._varlen.Segments` built from them): how the dispatcher tells a masked call
    mask_options: tuple[str, ...] = ("attention_mask", "cu_seqlens")
    kinds: ClassVar[tuple[str, ...]] = ("reference", "torch", "cpu", "triton")

    def __post_init__(self) -> None:
        for name, b in self.backends.items():
            if b.kind not in self.kinds:
                raise ValueError(f"{self.op}: backend {name!r} has kind {b.kind!r}; valid kinds: {list(self.kinds)}")
        if self.default not in self.backends or self.reference not in self.backends:
            raise ValueError(f"{self.op}: default {self.default!r} and reference {self.reference!r} must be backends")

    def masked(self, options: Mapping[str, Any] | None) -> bool:
        """Whether a call with these keyword options is masked (one of :attr:`mask_options` is given)."""
        return options is not None and any(options.get(k) is not None for k in self.mask_options)

    def mask_backends(self) -> list[str]:
        """The available backends that take ``attention_mask`` / ``cu_seqlens``."""
        return [n for n, b in self.backends.items() if b.masks and b.is_available()]

    def backend_names(self) -> list[str]:
        """The names ``backend=`` accepts in this process: ``"auto"`` and the available backends."""
        return ["auto"] + [n for n, b in self.backends.items() if b.is_available()]

    def check_cases(self) -> tuple["CheckCase", ...]:
        """The selftest cases of :attr:`checks` (imported now), each bound to the mechanism whose backends it runs."""
        if self.checks is None:
            return ()
        cases = importlib.import_module(self.checks).CASES
        return tuple(c if c.mechanism is not None else dataclasses.replace(c, mechanism=self) for c in cases)


@dataclass(frozen=True)
class CheckCase:
    """One named case of ``attnzoo selftest`` for an op, declared in ``ops/<op>/selftest_cases.py``.

    ``make(shape, cfg, gen)`` draws float64 CPU inputs (a dict of tensors); ``call(x, cfg, backend)`` runs the public
    op with ``backend`` (output token axis 2); ``grads`` names the differentiable inputs; ``tokens`` maps an input to
    its token axis (the causal leak test); ``step(x, cfg)`` is the token-by-token causal output, or ``None``;
    ``configs(quick)`` and ``shapes(quick)`` list the configs (plain values; ``causal`` and ``max_n``, which skips
    ``(B, H, N, P)`` shapes with longer N, are read by the selftest) and shapes. ``mechanism`` is the op whose
    backends run (``None``: the mechanism declaring the case; MEGA's cases include its EMA's).
    """

    name: str
    make: Callable[..., dict[str, Any]]
    call: Callable[..., Any]
    grads: tuple[str, ...]
    configs: Callable[[bool], list[dict[str, Any]]]
    shapes: Callable[[bool], list[tuple[int, ...]]]
    tokens: Mapping[str, int] = field(default_factory=dict)
    step: Callable[..., Any] | None = None
    mechanism: Mechanism | None = None
