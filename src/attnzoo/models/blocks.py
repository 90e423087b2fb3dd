"""The one transformer skeleton: a :class:`Block` is a token mixer plus an optional MLP / ISTA step.

Layouts (``x`` is ``(B, N, dim)``; ``A`` the mixer, ``F`` the feed-forward part, ``γ`` LayerScale):

- ``norm="pre"``:  ``x += γ1·A(LN(x))``; ``x += γ2·F(LN(x))`` (GPT-2, ViT, XCiT, ToST Alg. 4)
- ``norm="post"``: ``x = LN(x + A(x))``; ``x = LN(x + F(x))`` (original Transformer; ToST Table 7 Pathfinder)
- ``norm="none"``: ``x += A(x)`` (AoT vision, Fig. 3)
- ``ffn="ista"``:  ``x = ISTA(LN(x + A(LN(x))))`` (CRATE; ToST/CBSA papers), no residual around ISTA.
- a mixer that owns its residual (``A.owns_residual``, MEGA's layer with its gated ``x + u (h - x)``, MEGA §3.2):
  ``x = A(x)`` (``x += γ1·(A(x) − x)`` with LayerScale), then the feed-forward half as above (MEGA's normalised
  FFN: ``norm="pre"`` or ``"post"``).

``norm_layer`` picks the block's normalisation: LayerNorm (``"layernorm"``), or MEGA's ScaleNorm / BatchNorm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.layers._norms import build_norm
from attnzoo.layers.base import Attention
from attnzoo.models.masking import mask_keywords, masked_step
from attnzoo.registry import attention_info, build_attention, list_attentions

__all__ = [
    "Mlp",
    "ISTA",
    "LayerScale",
    "Block",
    "build_blocks",
    "build_mixer",
    "check_mixer_form",
    "IDENTITY_MIXER",
    "IdentityMixer",
    "supports_step",
    "init_weights",
    "set_norm_eps",
]


class Mlp(nn.Module):
    """Two-layer perceptron ``fc2(act(fc1(x)))`` applied per token (ToST Alg. 3; SiLU in MEGA's FFN)."""

    def __init__(self, dim: int, hidden: int, *, act: str = "gelu", dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}[act]()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class ISTA(nn.Module):
    """CRATE's ISTA block: one non-negative proximal-gradient step of sparse coding against a learned
    dictionary ``D`` (dim x dim), ``ISTA(z) = ReLU(z + η·Dᵀ(z − D z) − η·λ)``.

    The step minimises ``λ‖x‖₁ + ½‖z − D x‖²`` over ``x ≥ 0`` from ``x = z`` (the sparsification step
    of the CRATE layer that the ToST and CBSA papers build on); ``η = step`` and ``λ = lambd`` are fixed.
    Applied per token, with no residual around it.
    """

    def __init__(self, dim: int, *, step: float = 0.1, lambd: float = 0.1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.step = float(step)
        self.lambd = float(lambd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.weight
        residual = x - F.linear(x, d)  # z - D z, in row-vector form
        return F.relu(x + self.step * F.linear(residual, d.t()) - self.step * self.lambd)

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, step={self.step}, lambd={self.lambd}"


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch (Touvron et al. 2021; used by XCiT/ToST)."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def supports_step(mixer: nn.Module) -> bool:
    """Whether a mixer implements token-by-token decoding (``init_state`` / ``step``)."""
    return bool(getattr(mixer, "supports_step", False)) and callable(getattr(mixer, "step", None))


class Block(nn.Module):
    """Token mixer + optional feed-forward part with pre/post/no LayerNorm, LayerScale, residual on/off."""

    def __init__(
        self,
        dim: int,
        mixer: Attention,
        *,
        ffn: str = "mlp",
        hidden: int | None = None,
        act: str = "gelu",
        norm: str = "pre",
        residual: bool = True,
        layerscale: float | None = None,
        dropout: float = 0.0,
        ista_step: float = 0.1,
        ista_lambda: float = 0.1,
        norm_layer: str = "layernorm",
    ) -> None:
        super().__init__()
        self.norm_kind = norm
        self.ffn_kind = ffn
        self.residual = residual
        self.owns_residual = bool(getattr(mixer, "owns_residual", False))
        if self.owns_residual and not residual:
            raise ValueError(
                f"{type(mixer).__name__} computes its own residual update (its output holds its input): "
                "residual=False cannot remove it; use residual=True"
            )
        # the mixer's own norm stands in for norm1 when it owns its residual
        self.norm1 = build_norm(norm_layer, dim) if norm != "none" and not self.owns_residual else nn.Identity()
        self.attn = mixer
        self.ls1 = LayerScale(dim, layerscale) if layerscale is not None else nn.Identity()
        self.drop = nn.Dropout(dropout)
        if ffn == "none":
            self.norm2 = self.ffn = self.ls2 = None
        else:
            self.norm2 = build_norm(norm_layer, dim) if norm != "none" else nn.Identity()
            if ffn == "mlp":
                self.ffn = Mlp(dim, hidden or 4 * dim, act=act, dropout=dropout)
                self.ls2 = LayerScale(dim, layerscale) if layerscale is not None else nn.Identity()
            else:
                self.ffn = ISTA(dim, step=ista_step, lambd=ista_lambda)
                self.ls2 = None

    def _run(self, x: torch.Tensor, mix) -> torch.Tensor:
        if self.owns_residual:
            # LayerScale scales the mixer's update: x + γ (A(x) - x), A(x) itself at γ = 1
            y = mix(x)
            x = y if isinstance(self.ls1, nn.Identity) else x + self.drop(self.ls1(y - x))
        elif self.norm_kind == "post":
            h = self.drop(self.ls1(mix(x)))
            x = self.norm1(x + h if self.residual else h)
        else:
            h = self.drop(self.ls1(mix(self.norm1(x))))
            x = x + h if self.residual else h
        if self.ffn is None:
            return x
        if self.ffn_kind == "ista":
            return self.ffn(self.norm2(x))
        if self.norm_kind == "post":
            h = self.drop(self.ls2(self.ffn(x)))
            return self.norm2(x + h if self.residual else h)
        h = self.drop(self.ls2(self.ffn(self.norm2(x))))
        return x + h if self.residual else h

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x (B, N, dim)``; ``attention_mask (B, N)`` / ``cu_seqlens (S + 1,)`` go to the mixer (the only part
        that mixes tokens), only when given."""
        kw = mask_keywords(self.attn, attention_mask, cu_seqlens)
        if not kw:
            return self._run(x, self.attn)
        return self._run(x, lambda h: self.attn(h, **kw))

    def step(self, x: torch.Tensor, state, *, attention_mask: torch.Tensor | None = None):
        """One decoding step: ``x (B, 1, dim)`` -> ``(B, 1, dim)``, new mixer state (everything else is per token).

        ``attention_mask (B, t + 1)``: the real tokens fed so far, this one last; a padding token leaves its row's
        mixer state unchanged (:func:`attnzoo.models.masking.masked_step`)."""
        box = {}

        def mix(h):
            y, box["state"] = masked_step(self.attn, h, state, attention_mask)
            return y

        y = self._run(x, mix)
        return y, box["state"]


#: the no-attention control's name (an ``attention=`` value of every model, not a registered mechanism)
IDENTITY_MIXER = "identity"


class IdentityMixer(Attention):
    """The no-attention control: ``A(x) = x``, no token mixing, so "attention helps" can be measured against it.

    Not a registered mechanism (it has no op to check or benchmark): models build it for ``attention="identity"``.
    Blocks keep their norms, residuals and feed-forward parts, so the control differs from its model in the
    mixer alone. Every token is its own output, so padding masks and causality hold trivially.
    """

    supports_causal = True
    supports_masks = True
    registry_name = IDENTITY_MIXER

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,  # noqa: ARG002 (a per-token map honours every mask)
        cu_seqlens: torch.Tensor | None = None,  # noqa: ARG002
    ) -> torch.Tensor:
        """``x`` (B, N, dim) unchanged."""
        self.check_input(x)
        return x


def check_mixer_form(name: str, causal: bool, model: str = "model") -> None:
    """Refuse the registered mechanism ``name`` where it lacks the form a ``model`` needs: a causal mode for a causal
    decoder (``causal``), a bidirectional one otherwise."""
    cls = attention_info(name)
    if causal and not cls.supports_causal:
        raise ValueError(
            f"attention {name!r} has no causal mode and this {model} is a causal decoder; "
            f"causal mechanisms are: {list_attentions(causal=True)}"
        )
    if not causal and not cls.supports_noncausal:
        raise ValueError(
            f"attention {name!r} is causal-only but this {model} is bidirectional; "
            f"bidirectional mechanisms are: {list_attentions(causal=False)}"
        )


def build_mixer(
    name: str,
    dim: int,
    heads: int,
    *,
    causal: bool,
    options: dict,
    context: dict,
) -> Attention:
    """Build a mechanism, filling in the ``context`` options (layer index, grid, ...) it accepts.

    Context entries are only passed when they are options of the mechanism (its spec's options dataclass) and
    the user did not set them, so CSP gets its ``layer_index``, CBSA its token ``grid``, causal TSSA its ``max_len``.
    """
    if name == IDENTITY_MIXER:
        if options:
            raise ValueError(f"attention {IDENTITY_MIXER!r} (the no-attention control) takes no options, got {options}")
        return IdentityMixer(dim, heads, causal=causal)
    cls = attention_info(name)
    check_mixer_form(name, causal)
    accepted = set(cls.mechanism.options.names()) if cls.mechanism is not None else set()
    # JSON turns tuples (grids, ...) into lists; mechanisms expect the tuple form
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    for k, v in context.items():
        if k not in opts and k in accepted:
            opts[k] = tuple(v) if isinstance(v, list) else v
    return build_attention(name, dim, heads, causal=causal, **opts)


def build_blocks(cfg, *, causal: bool, context: dict | None = None) -> nn.ModuleList:
    """The ``cfg.depth`` blocks of a :class:`~attnzoo.models.config.BackboneConfig`."""
    context = dict(context or {})
    mechanisms = cfg.mechanisms()
    ffns = cfg.ffn_kinds()
    blocks = []
    for i, (mech, ffn) in enumerate(zip(mechanisms, ffns, strict=True)):
        options = cfg.attention_options if i < cfg.split_index() else cfg.second_attention_options
        # the skeleton's norm and dropout, for mixers that own their residual update and normalisation (MEGA)
        ctx = {
            "layer_index": i,
            "num_layers": cfg.depth,
            "norm_layer": cfg.norm_layer,
            "prenorm": cfg.norm != "post",
            "dropout": cfg.dropout,
            **context,
        }
        mixer = build_mixer(mech, cfg.dim, cfg.heads, causal=causal, options=options, context=ctx)
        blocks.append(
            Block(
                cfg.dim,
                mixer,
                ffn=ffn,
                hidden=cfg.hidden_dim,
                act=cfg.act,
                norm=cfg.norm,
                residual=cfg.residual,
                layerscale=cfg.layerscale,
                dropout=cfg.dropout,
                ista_step=cfg.ista_step,
                ista_lambda=cfg.ista_lambda,
                norm_layer=cfg.norm_layer,
            )
        )
    return nn.ModuleList(blocks)


def init_weights(module: nn.Module, *, std: float = 0.02) -> None:
    """Truncated-normal init (std 0.02) of the Linear/Embedding layers the models own.

    Token mixers are skipped: each mechanism initialises its own parameters as its paper does.
    """
    if isinstance(module, Attention):
        return
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
    for child in module.children():
        init_weights(child, std=std)


def set_norm_eps(module: nn.Module, eps: float) -> None:
    """Set the epsilon of every ``nn.LayerNorm`` in ``module`` (a config's ``norm_eps``).

    Done once on the built model rather than threaded through each constructor: the blocks, the
    class-attention layers, the patch embeddings and the final norm all take it, and ``eps`` holds no
    parameter, so state dicts (and old checkpoints) are unaffected.
    """
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = float(eps)
