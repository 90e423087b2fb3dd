"""The description of a mechanism, declared once in its ``ops/<op>/__init__.py``.

A :class:`Mechanism` says what a mechanism is to the rest of attnzoo: its typed options (an :class:`Options`
dataclass whose fields are checked by the shared checks of :mod:`attnzoo._checks`), the backends of its op (name ->
:class:`Backend`, each with the devices it runs on), whether it has a causal and a bidirectional form, and the type
of its recurrent decoding state. The op dispatches through it (:mod:`attnzoo.ops._dispatch`), its layer builds its
options from it, and ``build_attention`` / ``list_attentions`` / ``attention_info`` read it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

__all__ = ["Backend", "Mechanism", "Options", "option", "triton_available"]


@functools.lru_cache(maxsize=None)
def triton_available(module: str) -> bool:
    """Whether the ``triton`` package and the kernel module ``module`` can be imported (no import happens; the
    answer is kept for the process, as the installed packages do not change under it)."""
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class Backend:
    """One implementation of an op: ``module.attr`` called with the op's tensors and options.

    The callable is looked up at call time: optional kernels (Triton) are imported only when used, and a test can
    replace the function in its module. ``kind`` is what ``"auto"`` selects by: ``"reference"`` (the ``naive.py``
    of the op), ``"torch"`` (the PyTorch path), ``"cpu"`` (fused C++ kernels for CPU tensors), ``"triton"``.
    ``available`` (when given) says whether the backend can run in this process at all.

    Calling convention (:func:`attnzoo.ops._dispatch.call_backend`): ``fn(*inputs, **options)``, the op's tensor
    arguments in its order (``None`` for an absent optional one) and its checked keyword options, the same for
    every backend of the op; each backend prepares them itself (standardisation, dtype, layout, value checks).
    """

    module: str
    attr: str
    kind: str = "torch"
    #: device types it runs on (documentation; "cpu" kernels are refused elsewhere, Triton checks its own)
    devices: tuple[str, ...] = ("any",)
    available: Callable[[], bool] | None = None
    #: the kernel module it imports when it runs, if not ``module`` (a Triton backend also needs ``triton``)
    needs: str | None = None
    #: for ``"auto"`` (CPU kernels): whether it takes a call, given ``(inputs, options)``; ``None``: every call
    auto_if: Callable[[tuple, Mapping[str, Any]], bool] | None = None

    def is_available(self) -> bool:
        if self.available is not None:
            return self.available()
        if self.kind == "triton":
            return triton_available(self.needs or self.module)
        return True

    def load(self) -> Callable:
        # sys.modules first: torch.compile traces a dict lookup, not the import machinery
        mod = sys.modules.get(self.module)
        if mod is None:
            mod = importlib.import_module(self.module)
        return getattr(mod, self.attr)


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
    #: option sets the contract tests (tests/layers/test_contract.py) run besides the defaults, for a sequence of
    #: 9 tokens: the options that change the computation (orders, variants, chunking)
    examples: tuple[dict[str, Any], ...] = ()
    kinds: ClassVar[tuple[str, ...]] = ("reference", "torch", "cpu", "triton")

    def __post_init__(self) -> None:
        for name, b in self.backends.items():
            if b.kind not in self.kinds:
                raise ValueError(f"{self.op}: backend {name!r} has kind {b.kind!r}; valid kinds: {list(self.kinds)}")
        if self.default not in self.backends or self.reference not in self.backends:
            raise ValueError(f"{self.op}: default {self.default!r} and reference {self.reference!r} must be backends")

    def backend_names(self) -> list[str]:
        """The names ``backend=`` accepts in this process: ``"auto"`` and the available backends."""
        return ["auto"] + [n for n, b in self.backends.items() if b.is_available()]
