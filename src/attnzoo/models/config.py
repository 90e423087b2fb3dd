"""Model configurations: plain dataclasses that round-trip through JSON.

Every architecture has one config class. Unknown keys are an error that lists the valid keys; values are
validated when the config is built, so a bad config fails before any tensor is allocated.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attnzoo._checks import check_bool, check_choice, check_nonneg_int, check_positive_int, check_probability
from attnzoo.models._registry import config_class_for  # re-exported: the model files register the architectures

__all__ = [
    "ModelConfig",
    "BackboneConfig",
    "VisionConfig",
    "CausalLMConfig",
    "SequenceClassifierConfig",
    "ICLConfig",
    "config_class_for",
]

NORMS = ("pre", "post", "none")
FFNS = ("mlp", "ista", "none")
PATCH_EMBEDS = ("linear", "linear_ln", "conv")
VISION_POS = ("learned", "fourier", "none")
SEQ_POS = ("learned", "sinusoidal", "none")
VISION_POOLS = ("cls", "mean", "class_attention")
SEQ_POOLS = ("cls", "mean")
ACTS = ("gelu", "relu", "silu")
#: the blocks' normalisation: LayerNorm, or MEGA's ScaleNorm / BatchNorm over tokens (attnzoo.layers._norms)
NORM_LAYERS = ("layernorm", "scalenorm", "batchnorm")


def _jsonable(value: Any, where: str) -> Any:
    """Deep-copy ``value`` into JSON types (tuples become lists) or raise naming the offending key."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} keys must be strings, got {k!r}")
            out[k] = _jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} must be finite, got {value!r}")
        return value
    raise TypeError(
        f"{where} must be JSON-serialisable (str/int/float/bool/None/list/dict), got {type(value).__name__}"
    )


@dataclass
class ModelConfig:
    """Base of all model configs: JSON round-trip and strict keys."""

    #: architecture tag written into ``config.json``; picks the model class on load
    arch: ClassVar[str] = ""

    @classmethod
    def valid_keys(cls) -> list[str]:
        return sorted(f.name for f in dataclasses.fields(cls))

    @classmethod
    def check_keys(cls, keys, *, source: str | None = None) -> None:
        unknown = sorted(set(keys) - set(cls.valid_keys()))
        if unknown:
            where = f" (in {source})" if source else ""
            raise ValueError(f"unknown {cls.__name__} key(s) {unknown}{where}; valid keys: {cls.valid_keys()}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict including the ``arch`` tag."""
        d = {"arch": self.arch}
        d.update(_jsonable(dataclasses.asdict(self), type(self).__name__))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str | None = None) -> "ModelConfig":
        if not isinstance(d, dict):
            raise TypeError(f"a {cls.__name__} must be built from a dict, got {type(d).__name__}")
        d = dict(d)
        arch = d.pop("arch", cls.arch)
        if arch != cls.arch:
            raise ValueError(f"config arch {arch!r} does not match {cls.__name__} (arch {cls.arch!r})")
        cls.check_keys(d, source=source)
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))

    def replace(self, **overrides) -> "ModelConfig":
        """A copy with ``overrides`` applied (validated, unknown keys rejected)."""
        self.check_keys(overrides)
        return dataclasses.replace(self, **overrides)


@dataclass
class BackboneConfig(ModelConfig):
    """The transformer skeleton shared by every architecture: ``depth`` blocks of token mixer + FFN.

    ``attention`` is any registered mechanism (``attnzoo.list_attentions()``), built with
    ``attention_options``, or ``"identity"`` (the no-attention control, :class:`~attnzoo.models.blocks.IdentityMixer`).
    A hybrid uses ``second_attention`` for blocks ``>= second_attention_from``
    (CBSA §4.1 CRATE+CBT). ``ffn`` is ``"mlp"`` (two-layer GELU MLP), ``"ista"`` (CRATE's sparse coding
    step, no residual around it) or ``"none"`` (AoT); ``ffn_layers`` limits it to the first blocks
    (AoT §4.1 "Hybrid"). ``norm``: ``"pre"`` / ``"post"`` LayerNorm or ``"none"`` (AoT vision).
    ``layerscale``: initial LayerScale value (XCiT), or ``None`` for no LayerScale. ``norm_eps``: the
    epsilon of every LayerNorm in the model (PyTorch's 1e-5 by default; XCiT/ToST's code uses 1e-6).
    ``norm_layer``: the blocks' normalisation, ``"layernorm"``, or MEGA's ``"scalenorm"`` / ``"batchnorm"`` (the
    sequence classifier's final norm follows it; the other models keep LayerNorm there).
    """

    dim: int = 384
    depth: int = 12
    heads: int = 6
    attention: str = "softmax"
    attention_options: dict = field(default_factory=dict)
    second_attention: str | None = None
    second_attention_options: dict = field(default_factory=dict)
    second_attention_from: int | None = None
    ffn: str = "mlp"
    mlp_ratio: float = 4.0
    mlp_dim: int | None = None
    ffn_layers: int | None = None
    act: str = "gelu"
    norm: str = "pre"
    residual: bool = True
    layerscale: float | None = None
    final_norm: bool = True
    dropout: float = 0.0
    ista_step: float = 0.1
    ista_lambda: float = 0.1
    norm_eps: float = 1e-5
    norm_layer: str = "layernorm"

    def __post_init__(self) -> None:
        check_positive_int("dim", self.dim)
        check_positive_int("depth", self.depth)
        check_positive_int("heads", self.heads)
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} must be divisible by heads={self.heads}")
        for name in ("attention",):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a mechanism name (str), got {getattr(self, name)!r}")
        if self.second_attention is not None and not isinstance(self.second_attention, str):
            raise TypeError(f"second_attention must be a mechanism name or None, got {self.second_attention!r}")
        for name in ("attention_options", "second_attention_options"):
            v = getattr(self, name)
            if not isinstance(v, dict):
                raise TypeError(f"{name} must be a dict of keyword options, got {type(v).__name__}")
            setattr(self, name, _jsonable(v, name))
        if self.second_attention_from is not None:
            check_nonneg_int("second_attention_from", self.second_attention_from)
            if self.second_attention_from > self.depth:
                raise ValueError(
                    f"second_attention_from={self.second_attention_from} must be in [0, depth={self.depth}]"
                )
        check_choice("ffn", self.ffn, FFNS)
        check_choice("norm", self.norm, NORMS)
        check_choice("act", self.act, ACTS)
        check_choice("norm_layer", self.norm_layer, NORM_LAYERS)
        if not isinstance(self.mlp_ratio, (int, float)) or isinstance(self.mlp_ratio, bool) or self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be a positive number, got {self.mlp_ratio!r}")
        if self.mlp_dim is not None:
            check_positive_int("mlp_dim", self.mlp_dim)
        if self.ffn_layers is not None:
            check_nonneg_int("ffn_layers", self.ffn_layers)
            if self.ffn_layers > self.depth:
                raise ValueError(f"ffn_layers={self.ffn_layers} must be in [0, depth={self.depth}]")
        if self.ffn == "ista" and self.norm == "post":
            raise ValueError("ffn='ista' needs norm='pre' or 'none' (the ISTA step is not a residual branch)")
        if self.layerscale is not None and (
            not isinstance(self.layerscale, (int, float)) or isinstance(self.layerscale, bool) or self.layerscale <= 0
        ):
            raise ValueError(f"layerscale must be a positive initial value or None, got {self.layerscale!r}")
        check_bool("residual", self.residual)
        check_bool("final_norm", self.final_norm)
        check_probability("dropout", self.dropout)
        for name in ("ista_step", "ista_lambda"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative number, got {v!r}")
        if (
            not isinstance(self.norm_eps, (int, float))
            or isinstance(self.norm_eps, bool)
            or not math.isfinite(self.norm_eps)
            or self.norm_eps <= 0
        ):
            raise ValueError(f"norm_eps must be a positive finite number (LayerNorm epsilon), got {self.norm_eps!r}")

    @property
    def hidden_dim(self) -> int:
        return self.mlp_dim if self.mlp_dim is not None else int(round(self.dim * self.mlp_ratio))

    def split_index(self) -> int:
        """First block that uses ``second_attention`` (``depth`` when there is none)."""
        if self.second_attention is None:
            return self.depth
        return self.depth // 2 if self.second_attention_from is None else self.second_attention_from

    def mechanisms(self) -> list[str]:
        """The mechanism used by each block, in order."""
        start = self.split_index()
        return [self.attention if i < start else self.second_attention for i in range(self.depth)]

    def ffn_kinds(self) -> list[str]:
        n = self.depth if self.ffn_layers is None else self.ffn_layers
        return [self.ffn if i < n else "none" for i in range(self.depth)]


@dataclass
class VisionConfig(BackboneConfig):
    """Image classifier: patch embedding -> blocks -> pooling -> linear head; output ``(B, num_classes)``.

    ``patch_embed``: ``"linear"`` (ViT/DeiT: one ``patch x patch`` strided projection), ``"linear_ln"``
    (CRATE / vit-pytorch: LayerNorm -> Linear -> LayerNorm), ``"conv"`` (XCiT's stem of stride-2 3x3
    convolutions with BatchNorm, used by ToST/XCiT/CBT). ``pos_embed``: ``"learned"``, ``"fourier"``
    (XCiT), ``"none"``. ``pool``: ``"cls"`` token, ``"mean"`` of the patch tokens, or
    ``"class_attention"`` (XCiT/CaiT: ``class_attention_layers`` layers write to a CLS token appended
    after the blocks).
    """

    arch: ClassVar[str] = "vision"

    image_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    patch_embed: str = "linear"
    pos_embed: str = "learned"
    pool: str = "cls"
    class_attention_layers: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("image_size", "patch_size", "in_chans"):
            check_positive_int(name, getattr(self, name))
        check_nonneg_int("num_classes", self.num_classes)
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} must be divisible by patch_size={self.patch_size}")
        check_choice("patch_embed", self.patch_embed, PATCH_EMBEDS)
        check_choice("pos_embed", self.pos_embed, VISION_POS)
        check_choice("pool", self.pool, VISION_POOLS)
        if self.patch_embed == "conv" and (self.patch_size & (self.patch_size - 1) or self.patch_size < 2):
            raise ValueError(
                f"patch_embed='conv' stacks stride-2 convolutions, so patch_size must be a power of two >= 2, "
                f"got {self.patch_size}"
            )
        check_nonneg_int("class_attention_layers", self.class_attention_layers)
        if self.pool == "class_attention" and self.class_attention_layers < 1:
            raise ValueError("pool='class_attention' needs class_attention_layers >= 1")

    @property
    def grid(self) -> tuple[int, int]:
        g = self.image_size // self.patch_size
        return (g, g)


@dataclass
class CausalLMConfig(BackboneConfig):
    """Decoder-only language model (nanoGPT layout, tied input/output embeddings).

    Input ``(B, T)`` token ids with ``T <= block_size``; output logits ``(B, T, vocab_size)``.
    """

    arch: ClassVar[str] = "causal_lm"

    vocab_size: int = 50257
    block_size: int = 1024
    pos_embed: str = "learned"
    tie_weights: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("block_size", self.block_size)
        check_choice("pos_embed", self.pos_embed, SEQ_POS)
        check_bool("tie_weights", self.tie_weights)


@dataclass
class SequenceClassifierConfig(BackboneConfig):
    """Long-range sequence classifier (LRA): token embedding -> bidirectional blocks -> pooling -> head.

    Input ``(B, N)`` token ids (``N <= max_len``); output ``(B, num_classes)``. With ``dual=True``
    (LRA Retrieval) the model takes two sequences, encodes both with the shared encoder and classifies
    ``[u, v, u*v, u-v]`` of the pooled features.
    """

    arch: ClassVar[str] = "sequence_classifier"

    vocab_size: int = 256
    max_len: int = 1024
    num_classes: int = 2
    pool: str = "cls"
    pos_embed: str = "learned"
    head_dim: int | None = None
    dual: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("max_len", self.max_len)
        check_positive_int("num_classes", self.num_classes)
        check_choice("pool", self.pool, SEQ_POOLS)
        check_choice("pos_embed", self.pos_embed, SEQ_POS)
        if self.head_dim is not None:
            check_positive_int("head_dim", self.head_dim)
        check_bool("dual", self.dual)


@dataclass
class ICLConfig(BackboneConfig):
    """In-context regression (Garg et al. 2022; AoT §4.1.2): prompt ``(x_1, g(x_1), ..., x_N)``.

    Inputs ``xs (B, N, n_dims)`` and ``ys (B, N)``; output predictions ``(B, N)`` where prediction ``i``
    sees only ``x_1, y_1, ..., x_i`` (causal backbone over the interleaved ``2N`` tokens).
    """

    arch: ClassVar[str] = "icl_regressor"

    n_dims: int = 20
    max_points: int = 41
    pos_embed: str = "learned"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("n_dims", self.n_dims)
        check_positive_int("max_points", self.max_points)
        check_choice("pos_embed", self.pos_embed, SEQ_POS)
